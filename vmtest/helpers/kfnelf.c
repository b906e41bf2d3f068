// SPDX-License-Identifier: GPL-2.0
/*
 * kfnelf - wrap one kernel function's live bytes in a small ELF executable, so that
 * `trapctl inspect` can disassemble it in the guest (Debian's vmlinux has no symbols, and the
 * guest has no vmlinux at all).
 *
 *   trapctl read FUNCTION | kfnelf FUNCTION OUT
 *
 * Reads `trapctl read`'s hex dump ("ADDRESS: b0 b1 ...", 16 bytes a line, consecutive) on
 * stdin and writes OUT: an ET_EXEC x86-64 ELF with one section, .text, holding the bytes at
 * their kernel address (and a PT_LOAD for it), and a .symtab with FUNCTION, a global function
 * spanning them. Name OUT vmlinux-* or give `trapctl inspect --mode kernel` so that it is
 * planned as kernel code. The bytes are the running kernel's: the ftrace site at the entry is
 * the NOP ftrace made of it, alternatives are applied.
 *
 * Exit status: 0, 1 on a malformed dump, 2 on bad usage or an I/O error.
 */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BYTES (1 << 20)

static const char shstrtab[] = "\0.text\0.symtab\0.strtab\0.shstrtab";
#define SH_TEXT 1
#define SH_SYMTAB 7
#define SH_STRTAB 15
#define SH_SHSTRTAB 23

static unsigned char code[MAX_BYTES];

/* Parse the dump into code[]; returns its length and sets *start, or -1. */
static long read_dump(FILE *in, unsigned long *start)
{
	char line[256];
	long len = 0;

	while (fgets(line, sizeof(line), in)) {
		unsigned long at;
		char *p, *end;

		at = strtoul(line, &p, 16);
		if (p == line || *p != ':') {
			fprintf(stderr, "kfnelf: not a `trapctl read` line: %s", line);
			return -1;
		}
		if (!len)
			*start = at;
		else if (at != *start + len) {
			fprintf(stderr, "kfnelf: line at %lx does not follow %lx\n", at, *start + len);
			return -1;
		}
		for (p++;; p = end) {
			unsigned long b = strtoul(p, &end, 16);

			if (end == p)
				break;
			if (b > 0xff || len == MAX_BYTES) {
				fprintf(stderr, "kfnelf: bad byte or more than %d bytes at %lx\n",
					MAX_BYTES, at);
				return -1;
			}
			code[len++] = b;
		}
	}
	if (!len)
		fprintf(stderr, "kfnelf: no bytes on stdin\n");
	return len ? len : -1;
}

static int put(FILE *out, const void *p, size_t n)
{
	return fwrite(p, 1, n, out) == n ? 0 : -1;
}

/* Zero bytes up to the next multiple of 8 of *off. */
static int pad8(FILE *out, unsigned long *off)
{
	static const char zero[8];
	size_t n = (8 - *off % 8) % 8;

	*off += n;
	return put(out, zero, n);
}

static void set_shdr(Elf64_Shdr *sh, Elf64_Word name, Elf64_Word type, unsigned long off,
		     unsigned long size, unsigned long align)
{
	sh->sh_name = name;
	sh->sh_type = type;
	sh->sh_offset = off;
	sh->sh_size = size;
	sh->sh_addralign = align;
}

int main(int argc, char **argv)
{
	unsigned long start = 0, off, text_off, sym_off, str_off, shstr_off, sh_off;
	Elf64_Ehdr eh = { 0 };
	Elf64_Phdr ph = { 0 };
	Elf64_Shdr sh[5] = { { 0 } };
	Elf64_Sym sym[2] = { { 0 } };
	size_t name_len;
	FILE *out;
	long len;
	int err = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: trapctl read FUNCTION | kfnelf FUNCTION OUT\n");
		return 2;
	}
	len = read_dump(stdin, &start);
	if (len < 0)
		return 1;
	name_len = strlen(argv[1]);

	/* Layout: header, program header, .text, .symtab, .strtab, .shstrtab, section headers. */
	text_off = sizeof(eh) + sizeof(ph);
	off = text_off + len;
	sym_off = off + (8 - off % 8) % 8;
	str_off = sym_off + sizeof(sym);
	shstr_off = str_off + 1 + name_len + 1;
	off = shstr_off + sizeof(shstrtab);
	sh_off = off + (8 - off % 8) % 8;

	memcpy(eh.e_ident, ELFMAG, SELFMAG);
	eh.e_ident[EI_CLASS] = ELFCLASS64;
	eh.e_ident[EI_DATA] = ELFDATA2LSB;
	eh.e_ident[EI_VERSION] = EV_CURRENT;
	eh.e_type = ET_EXEC;
	eh.e_machine = EM_X86_64;
	eh.e_version = EV_CURRENT;
	eh.e_entry = start;
	eh.e_phoff = sizeof(eh);
	eh.e_shoff = sh_off;
	eh.e_ehsize = sizeof(eh);
	eh.e_phentsize = sizeof(ph);
	eh.e_phnum = 1;
	eh.e_shentsize = sizeof(sh[0]);
	eh.e_shnum = 5;
	eh.e_shstrndx = 4;

	ph.p_type = PT_LOAD;
	ph.p_flags = PF_R | PF_X;
	ph.p_offset = text_off;
	ph.p_vaddr = ph.p_paddr = start;
	ph.p_filesz = ph.p_memsz = len;
	ph.p_align = 1;

	sym[1].st_name = 1;
	sym[1].st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
	sym[1].st_shndx = 1;
	sym[1].st_value = start;
	sym[1].st_size = len;

	set_shdr(&sh[1], SH_TEXT, SHT_PROGBITS, text_off, len, 1);
	sh[1].sh_flags = SHF_ALLOC | SHF_EXECINSTR;
	sh[1].sh_addr = start;
	set_shdr(&sh[2], SH_SYMTAB, SHT_SYMTAB, sym_off, sizeof(sym), 8);
	sh[2].sh_link = 3;	/* .strtab */
	sh[2].sh_info = 1;	/* the first global symbol */
	sh[2].sh_entsize = sizeof(sym[0]);
	set_shdr(&sh[3], SH_STRTAB, SHT_STRTAB, str_off, 1 + name_len + 1, 1);
	set_shdr(&sh[4], SH_SHSTRTAB, SHT_STRTAB, shstr_off, sizeof(shstrtab), 1);

	out = fopen(argv[2], "wb");
	if (!out) {
		perror(argv[2]);
		return 2;
	}
	off = text_off + len;
	err |= put(out, &eh, sizeof(eh));
	err |= put(out, &ph, sizeof(ph));
	err |= put(out, code, len);
	err |= pad8(out, &off);
	err |= put(out, sym, sizeof(sym));
	err |= put(out, "", 1);
	err |= put(out, argv[1], name_len + 1);
	err |= put(out, shstrtab, sizeof(shstrtab));
	off = shstr_off + sizeof(shstrtab);
	err |= pad8(out, &off);
	err |= put(out, sh, sizeof(sh));
	if (fclose(out) || err) {
		perror(argv[2]);
		return 2;
	}
	return 0;
}
