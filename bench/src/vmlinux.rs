//! Getting `vmlinux` (an uncompressed ELF) out of a `vmlinuz` image, the way the kernel's own
//! `scripts/extract-vmlinux` does: if the file is already an ELF it is taken as is; otherwise, for
//! each compression in extract-vmlinux's order (gzip, xz, bzip2, lzma, lzo, lz4, zstd), every
//! place where that format's magic bytes occur is tried, and the first stream that decompresses to
//! an x86-64 ELF wins. Pure: bytes in, bytes out.
//!
//! A candidate is abandoned as soon as its first four output bytes are not `\x7fELF`, so the
//! false matches of short magics (lzma's `5d 00 00 00`) cost almost nothing. The LZ4 and LZO
//! framings the kernel uses (`lz4 -l` legacy frames, `lzop` files) are parsed here; the block
//! decoders come from `lz4_flex` and `lzokay-native`.

use std::fmt;
use std::io::{self, Read, Write};

use thiserror::Error;

/// The compressions `extract-vmlinux` tries, in its order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// The file was already an ELF.
    None,
    Gzip,
    Xz,
    Bzip2,
    Lzma,
    Lzo,
    Lz4,
    Zstd,
}

impl Compression {
    /// Every compression, in the order `extract-vmlinux` tries them.
    pub const ORDER: [Compression; 7] = [
        Compression::Gzip,
        Compression::Xz,
        Compression::Bzip2,
        Compression::Lzma,
        Compression::Lzo,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// The magic bytes `extract-vmlinux` looks for.
    pub fn magic(self) -> &'static [u8] {
        match self {
            Compression::None => b"\x7fELF",
            Compression::Gzip => &[0x1f, 0x8b, 0x08],
            Compression::Xz => &[0xfd, b'7', b'z', b'X', b'Z', 0x00],
            Compression::Bzip2 => b"BZh",
            Compression::Lzma => &[0x5d, 0x00, 0x00, 0x00],
            Compression::Lzo => &[0x89, b'L', b'Z', b'O'],
            Compression::Lz4 => &LZ4_LEGACY_MAGIC,
            Compression::Zstd => &[0x28, 0xb5, 0x2f, 0xfd],
        }
    }
}

impl fmt::Debug for Extracted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Extracted {{ {} at {:#x}, {} bytes }}",
            self.compression,
            self.offset,
            self.elf.len()
        )
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Xz => "xz",
            Compression::Bzip2 => "bzip2",
            Compression::Lzma => "lzma",
            Compression::Lzo => "lzo",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        })
    }
}

/// Magic of an LZ4 legacy frame (`0x184C2102`, little-endian).
pub const LZ4_LEGACY_MAGIC: [u8; 4] = [0x02, 0x21, 0x4c, 0x18];
/// Uncompressed size of every block of an LZ4 legacy frame but the last.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;
/// The lzop file magic.
const LZOP_MAGIC: [u8; 9] = [0x89, b'L', b'Z', b'O', 0x00, 0x0d, 0x0a, 0x1a, 0x0a];
/// Largest lzop block the kernel's decompressor accepts (256 KiB); lzop itself writes 256 KiB.
const LZOP_MAX_BLOCK: usize = 64 << 20;
/// Largest image accepted (a guard against a false stream that decompresses forever).
const MAX_OUTPUT: u64 = 1 << 30;

/// What went wrong extracting a vmlinux.
#[derive(Debug, Error)]
pub enum ExtractError {
    #[error("{what}: no ELF image found: tried {tried} candidate stream(s) of {formats} (the kernel's extract-vmlinux order)")]
    NotFound {
        what: String,
        tried: usize,
        formats: String,
    },
}

/// A vmlinux found in an image.
pub struct Extracted {
    pub compression: Compression,
    /// Offset of the compressed stream in the image.
    pub offset: usize,
    pub elf: Vec<u8>,
}

/// Why one candidate stream was not a vmlinux (logged, never returned).
#[derive(Debug, Error)]
enum Candidate {
    #[error("does not decompress to an ELF")]
    NotElf,
    #[error("{0}")]
    Broken(String),
}

impl From<io::Error> for Candidate {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::InvalidData && e.to_string() == NOT_ELF {
            Candidate::NotElf
        } else {
            Candidate::Broken(e.to_string())
        }
    }
}

const NOT_ELF: &str = "output is not an ELF";

/// A sink that fails as soon as the output cannot be an ELF, and past [`MAX_OUTPUT`].
struct ElfSink {
    out: Vec<u8>,
}

impl Write for ElfSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let had = self.out.len();
        if had < 4 {
            let need = (4 - had).min(buf.len());
            if buf[..need] != b"\x7fELF"[had..had + need] {
                return Err(io::Error::new(io::ErrorKind::InvalidData, NOT_ELF));
            }
        }
        if (had + buf.len()) as u64 > MAX_OUTPUT {
            return Err(io::Error::other("more than 1 GiB of output"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn drain(mut r: impl Read) -> Result<Vec<u8>, Candidate> {
    let mut sink = ElfSink { out: Vec::new() };
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => sink.write_all(&buf[..n])?,
            // Trailing bytes after a complete stream (the kernel appends the size) are fine
            // when what came before is a whole ELF.
            Err(e) if is_whole_elf(&sink.out) => {
                log::debug!("stream ended with an error after a whole ELF: {e}");
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(sink.out)
}

/// Whether `data` is an ELF whose section header table lies inside it.
pub fn is_whole_elf(data: &[u8]) -> bool {
    let Ok(file) = object::read::elf::ElfFile64::<object::Endianness>::parse(data) else {
        return false;
    };
    use object::read::elf::FileHeader;
    let h = file.elf_header();
    let e = file.endian();
    let end = h.e_shoff(e) + u64::from(h.e_shnum(e)) * u64::from(h.e_shentsize(e));
    end <= data.len() as u64 && h.e_machine(e) == object::elf::EM_X86_64
}

fn decompress(c: Compression, stream: &[u8]) -> Result<Vec<u8>, Candidate> {
    let out = match c {
        Compression::None => stream.to_vec(),
        Compression::Gzip => drain(flate2::read::GzDecoder::new(stream))?,
        Compression::Bzip2 => drain(bzip2::read::BzDecoder::new(stream))?,
        Compression::Zstd => {
            let d = ruzstd::decoding::StreamingDecoder::new(stream)
                .map_err(|e| Candidate::Broken(e.to_string()))?;
            drain(d)?
        }
        Compression::Xz => {
            let mut sink = ElfSink { out: Vec::new() };
            let r = lzma_rs::xz_decompress(&mut &stream[..], &mut sink);
            finish_lzma(r, sink)?
        }
        Compression::Lzma => lzma_alone(stream)?,
        Compression::Lz4 => lz4_legacy(stream)?,
        Compression::Lzo => lzop(stream)?,
    };
    if !is_whole_elf(&out) {
        return Err(Candidate::NotElf);
    }
    Ok(out)
}

/// An `.lzma` (LZMA-alone) stream of unknown size ends with an end marker, and lzma-rs
/// refuses one followed by more bytes (the kernel appends the image size) after buffering the
/// last output. The decoder reads its input exactly up to the marker, so the first pass tells
/// where the stream ends and the second decodes just that.
fn lzma_alone(stream: &[u8]) -> Result<Vec<u8>, Candidate> {
    let mut input = stream;
    let mut sink = ElfSink { out: Vec::new() };
    match lzma_rs::lzma_decompress(&mut input, &mut sink) {
        Ok(()) => finish_lzma(Ok(()), sink),
        Err(lzma_rs::error::Error::LzmaError(m)) if m.contains("more bytes are available") => {
            let end = stream.len() - input.len();
            log::debug!("lzma: stream ends at {end:#x}; trailing bytes after it");
            let mut sink = ElfSink { out: Vec::new() };
            let r = lzma_rs::lzma_decompress(&mut &stream[..end], &mut sink);
            finish_lzma(r, sink)
        }
        Err(e) => finish_lzma(Err(e), sink),
    }
}

fn finish_lzma(r: Result<(), lzma_rs::error::Error>, sink: ElfSink) -> Result<Vec<u8>, Candidate> {
    match r {
        Ok(()) => Ok(sink.out),
        Err(_) if is_whole_elf(&sink.out) => Ok(sink.out),
        Err(lzma_rs::error::Error::IoError(e)) => Err(e.into()),
        Err(e) => Err(Candidate::Broken(format!("{e:?}"))),
    }
}

/// An LZ4 legacy frame (`lz4 -l`, what the kernel's `unlz4` reads): the magic, then blocks of
/// `u32 LE compressed size` + an LZ4 block of at most 8 MiB output. A size that does not fit the
/// remaining input ends the frame (the kernel appends the uncompressed size after it), and so
/// does a repeated magic.
fn lz4_legacy(stream: &[u8]) -> Result<Vec<u8>, Candidate> {
    let mut rest = stream
        .strip_prefix(&LZ4_LEGACY_MAGIC[..])
        .ok_or(Candidate::NotElf)?;
    let mut sink = ElfSink { out: Vec::new() };
    let mut block = vec![0u8; LZ4_LEGACY_BLOCK];
    while rest.len() >= 4 {
        let size = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        if size.to_le_bytes() == LZ4_LEGACY_MAGIC {
            rest = &rest[4..];
            continue;
        }
        let size = size as usize;
        if size == 0
            || size > rest.len() - 4
            || size > lz4_flex::block::get_maximum_output_size(LZ4_LEGACY_BLOCK)
        {
            break;
        }
        let n = lz4_flex::block::decompress_into(&rest[4..4 + size], &mut block).map_err(|e| {
            Candidate::Broken(format!(
                "lz4 block at {:#x}: {e}",
                stream.len() - rest.len()
            ))
        })?;
        sink.write_all(&block[..n])?;
        rest = &rest[4 + size..];
    }
    Ok(sink.out)
}

/// Flags of an lzop header that matter for reading its blocks.
const LZOP_ADLER32_D: u32 = 0x1;
const LZOP_ADLER32_C: u32 = 0x2;
const LZOP_EXTRA_FIELD: u32 = 0x40;
const LZOP_CRC32_D: u32 = 0x100;
const LZOP_CRC32_C: u32 = 0x200;
const LZOP_FILTER: u32 = 0x800;

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Candidate> {
        let s = self
            .data
            .get(self.pos..self.pos + n)
            .ok_or_else(|| Candidate::Broken(format!("lzop: truncated at {:#x}", self.pos)))?;
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Candidate> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Candidate> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, Candidate> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// An lzop file (what the kernel's `unlzo` reads): header, then blocks of `u32 BE uncompressed
/// size` (0 ends), `u32 BE compressed size`, the checksums the header's flags announce, and the
/// LZO1X data (stored as is when it did not shrink).
fn lzop(stream: &[u8]) -> Result<Vec<u8>, Candidate> {
    if !stream.starts_with(&LZOP_MAGIC) {
        return Err(Candidate::NotElf);
    }
    let mut c = Cursor {
        data: stream,
        pos: LZOP_MAGIC.len(),
    };
    let version = c.u16()?;
    let _lib_version = c.u16()?;
    if version >= 0x0940 {
        let _needed = c.u16()?;
    }
    let _method = c.u8()?;
    if version >= 0x0940 {
        let _level = c.u8()?;
    }
    let flags = c.u32()?;
    if flags & LZOP_FILTER != 0 {
        c.u32()?;
    }
    let _mode = c.u32()?;
    let _mtime_low = c.u32()?;
    if version >= 0x0940 {
        let _mtime_high = c.u32()?;
    }
    let name_len = c.u8()?;
    c.take(usize::from(name_len))?;
    let _header_checksum = c.u32()?;
    if flags & LZOP_EXTRA_FIELD != 0 {
        let len = c.u32()? as usize;
        c.take(len)?;
        c.u32()?;
    }
    let mut sink = ElfSink { out: Vec::new() };
    loop {
        let dst_len = c.u32()? as usize;
        if dst_len == 0 {
            break;
        }
        if dst_len > LZOP_MAX_BLOCK {
            return Err(Candidate::Broken(format!("lzop: block of {dst_len} bytes")));
        }
        let src_len = c.u32()? as usize;
        let checks_d =
            u32::from(flags & LZOP_ADLER32_D != 0) + u32::from(flags & LZOP_CRC32_D != 0);
        let checks_c =
            u32::from(flags & LZOP_ADLER32_C != 0) + u32::from(flags & LZOP_CRC32_C != 0);
        c.take(4 * checks_d as usize)?;
        if src_len < dst_len {
            c.take(4 * checks_c as usize)?;
        }
        let data = c.take(src_len)?;
        if src_len == dst_len {
            sink.write_all(data)?;
        } else {
            let out = lzokay_native::decompress_all(data, Some(dst_len)).map_err(|e| {
                Candidate::Broken(format!("lzo block at {:#x}: {e:?}", c.pos - src_len))
            })?;
            sink.write_all(&out)?;
        }
    }
    Ok(sink.out)
}

/// A whole compressed ELF file (a `.ko.xz`, `.ko.gz`, `.ko.zst`): decompressed when it starts
/// with one of the magics, `None` otherwise.
pub fn decompress_whole(data: &[u8]) -> Option<Vec<u8>> {
    let c = Compression::ORDER
        .into_iter()
        .find(|c| data.starts_with(c.magic()))?;
    decompress(c, data)
        .map_err(|e| log::debug!("{c} file: {e}"))
        .ok()
}

/// Offsets of every occurrence of `needle` in `hay`.
fn find_all<'a>(hay: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    let first = needle[0];
    hay.iter()
        .enumerate()
        .filter(move |&(i, &b)| b == first && hay[i..].starts_with(needle))
        .map(|(i, _)| i)
}

/// Extract the vmlinux ELF from `image` (a `vmlinuz` or an already uncompressed `vmlinux`);
/// `what` names the image in errors.
pub fn extract_vmlinux(image: &[u8], what: &str) -> Result<Extracted, ExtractError> {
    if image.starts_with(b"\x7fELF") && is_whole_elf(image) {
        return Ok(Extracted {
            compression: Compression::None,
            offset: 0,
            elf: image.to_vec(),
        });
    }
    let mut tried = 0;
    for c in Compression::ORDER {
        for offset in find_all(image, c.magic()) {
            tried += 1;
            match decompress(c, &image[offset..]) {
                Ok(elf) => {
                    log::debug!(
                        "{what}: {c} stream at {offset:#x} holds a {} byte ELF",
                        elf.len()
                    );
                    return Ok(Extracted {
                        compression: c,
                        offset,
                        elf,
                    });
                }
                Err(e) => log::debug!("{what}: {c} candidate at {offset:#x}: {e}"),
            }
        }
    }
    let formats = Compression::ORDER
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    Err(ExtractError::NotFound {
        what: what.to_string(),
        tried,
        formats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A small real x86-64 ELF to compress: the test binary itself is too big; `/bin/true` is
    /// on every machine this runs on.
    fn small_elf() -> Vec<u8> {
        let elf = std::fs::read("/bin/true").expect("/bin/true");
        assert!(is_whole_elf(&elf));
        elf
    }

    /// Compress `data` with a command-line tool; `None` when the tool is not installed.
    fn compress(tool: &str, args: &[&str], data: &[u8]) -> Option<Vec<u8>> {
        let mut child = Command::new(tool)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let mut stdin = child.stdin.take().unwrap();
        let data = data.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&data));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success(), "{tool} failed");
        Some(out.stdout)
    }

    /// Wrap a compressed stream as a bzImage does: code before it, the size after it.
    fn as_image(stream: &[u8], elf_len: usize) -> Vec<u8> {
        let mut img = vec![0x90u8; 0x1234];
        img.extend_from_slice(
            b"HdrS\x0f\x02 setup code with a false lzma magic \x5d\x00\x00\x00\x12\x34",
        );
        img.extend_from_slice(stream);
        img.extend_from_slice(&u32::try_from(elf_len).unwrap().to_le_bytes());
        img.extend_from_slice(&[0u8; 64]);
        img
    }

    fn check(tool: &str, args: &[&str], expect: Compression) {
        let elf = small_elf();
        let Some(stream) = compress(tool, args, &elf) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "{tool} is not installed (CI installs it)"
            );
            eprintln!("skipping {expect}: {tool} not installed");
            return;
        };
        let img = as_image(&stream, elf.len());
        let x = extract_vmlinux(&img, "test image").unwrap_or_else(|e| panic!("{expect}: {e}"));
        assert_eq!(x.compression, expect);
        assert!(
            x.elf == elf,
            "{expect}: the extracted ELF differs from the original"
        );
        assert!(x.offset > 0x1234);
    }

    #[test]
    fn gzip_stream_inside_an_image_is_extracted_byte_for_byte() {
        check("gzip", &["-9", "-c"], Compression::Gzip);
    }

    #[test]
    fn xz_stream_is_extracted() {
        check("xz", &["--check=crc32", "-c"], Compression::Xz);
    }

    #[test]
    fn bzip2_stream_is_extracted() {
        check("bzip2", &["-9", "-c"], Compression::Bzip2);
    }

    #[test]
    fn lzma_stream_is_extracted_despite_a_false_magic_before_it() {
        check("lzma", &["-9", "-c"], Compression::Lzma);
    }

    #[test]
    fn lzo_lzop_file_is_extracted() {
        check("lzop", &["-9", "-c"], Compression::Lzo);
    }

    #[test]
    fn lz4_legacy_frame_is_extracted() {
        check("lz4", &["-l", "-9", "-c"], Compression::Lz4);
    }

    #[test]
    fn zstd_stream_is_extracted() {
        check("zstd", &["-19", "-c"], Compression::Zstd);
    }

    #[test]
    fn plain_elf_is_taken_as_is() {
        let elf = small_elf();
        let x = extract_vmlinux(&elf, "elf").unwrap();
        assert_eq!(x.compression, Compression::None);
        assert_eq!(x.elf.len(), elf.len());
    }

    #[test]
    fn image_without_an_elf_is_an_error_counting_the_candidates() {
        let img = as_image(b"\x1f\x8b\x08 not really gzip", 5);
        let err = extract_vmlinux(&img, "junk").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("junk: no ELF image found: tried 2 candidate stream(s)"),
            "{msg}"
        );
    }

    #[test]
    fn lz4_legacy_frame_of_several_blocks_joins_them() {
        // Two hand-made blocks of literals only: token 0x50 = 5 literals, no match.
        let mut s = LZ4_LEGACY_MAGIC.to_vec();
        for chunk in [&b"\x7fELF\x02"[..], b"hello"] {
            s.extend_from_slice(&6u32.to_le_bytes());
            s.push(0x50);
            s.extend_from_slice(chunk);
        }
        s.extend_from_slice(&10u32.to_le_bytes()); // the appended size: ends the frame
        let out = lz4_legacy(&s).unwrap();
        assert_eq!(out, b"\x7fELF\x02hello");
    }
}
