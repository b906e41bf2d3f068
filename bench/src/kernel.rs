//! Where the kernel code comes from: the installed `/boot/vmlinuz-<version>` (extracted with
//! [`crate::vmlinux`]), its symbols (`/proc/kallsyms` of that kernel booted in the VM through
//! `vmtest`, or a kallsyms file the user gives), and its network driver modules under
//! `/lib/modules/<version>/kernel/drivers/net/`.
//!
//! kallsyms read from the VM and the extracted vmlinux are cached under the cache directory
//! (`target/bench/` by default) by kernel version, so only the first run boots a guest.
//! A kallsyms is checked against the image before use: `_etext - _text` must equal the length
//! of the image's `.text` section, so symbols of another kernel (the host's own, say) are
//! refused instead of giving nonsense.

use std::path::{Path, PathBuf};
use std::time::Duration;

use object::{Object, ObjectSection};
use thiserror::Error;

use crate::vmlinux::{extract_vmlinux, Compression, ExtractError};
use instr_manager::image::{CodeImage, ImageError};

/// Markers around the kallsyms dump on the guest console.
const BEGIN: &str = "BENCH-KALLSYMS-BEGIN";
const END: &str = "BENCH-KALLSYMS-END";
const MD5: &str = "BENCH-KALLSYMS-MD5 ";

#[derive(Debug, Error)]
pub enum KernelError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no kernel image")]
    NoImage(#[source] vmtest::host::HostError),
    #[error(transparent)]
    Extract(#[from] ExtractError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("kallsyms {source_name} does not belong to {image}: _etext - _text is {ksize:#x} bytes, the image's .text {esize:#x}")]
    Mismatch {
        source_name: String,
        image: String,
        ksize: u64,
        esize: u64,
    },
    #[error("kallsyms {source_name} lacks `{symbol}`")]
    MissingSymbol {
        source_name: String,
        symbol: &'static str,
    },
    #[error("booting {version} in the VM for its kallsyms: writing the scenario")]
    VmScenario {
        version: String,
        #[source]
        source: std::io::Error,
    },
    #[error("booting {version} in the VM for its kallsyms")]
    VmRun {
        version: String,
        #[source]
        source: Box<vmtest::runner::RunError>,
    },
    #[error("booting {version} in the VM for its kallsyms: {summary}")]
    VmFailed { version: String, summary: String },
    #[error("the kallsyms of {version} on the VM's console")]
    VmDump {
        version: String,
        #[source]
        source: DumpError,
    },
    #[error("{image} is not called vmlinuz-<version>: give its kallsyms with --kallsyms")]
    NeedKallsyms { image: PathBuf },
    #[error("no network driver `{name}` under {dir}")]
    NoDriver { name: String, dir: PathBuf },
}

/// An installed kernel image.
#[derive(Clone, Debug)]
pub struct KernelImage {
    /// `/boot/vmlinuz-<version>`.
    pub vmlinuz: PathBuf,
    /// The release string, from a `vmlinuz-<version>` file name; `None` for other names (then
    /// nothing is cached and kallsyms must be given).
    pub version: Option<String>,
    /// `/lib/modules/<version>`.
    pub modules: PathBuf,
}

impl KernelImage {
    /// `path`, or the newest `/boot/vmlinuz-*-cloud-amd64` (the kernel vmtest boots).
    pub fn find(path: Option<&Path>) -> Result<KernelImage, KernelError> {
        let vmlinuz = match path {
            Some(p) => p.to_path_buf(),
            None => vmtest::host::newest_image(Path::new(vmtest::host::BOOT_DIR))
                .map_err(KernelError::NoImage)?,
        };
        let version = vmlinuz
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("vmlinuz-"))
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        let modules =
            Path::new(vmtest::host::MODULES_DIR).join(version.as_deref().unwrap_or("unknown"));
        Ok(KernelImage {
            vmlinuz,
            version,
            modules,
        })
    }

    /// The version, or the file name when the image is not called `vmlinuz-<version>`.
    pub fn label(&self) -> String {
        self.version
            .clone()
            .unwrap_or_else(|| self.vmlinuz.display().to_string())
    }
}

/// The default cache directory: `target/bench/` of the workspace.
pub fn default_cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench")
}

fn read(path: &Path) -> Result<Vec<u8>, KernelError> {
    std::fs::read(path).map_err(|source| KernelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, data: &[u8]) -> Result<(), KernelError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| KernelError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, data).map_err(|source| KernelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The extracted vmlinux of `k`, cached as `vmlinux-<version>` in `cache`; returns its path,
/// bytes and the compression it was found in.
pub fn vmlinux_of(
    k: &KernelImage,
    cache: &Path,
) -> Result<(PathBuf, Vec<u8>, Compression), KernelError> {
    let Some(version) = &k.version else {
        // Not a `vmlinuz-<version>`: extract every time; keep a copy for objdump unless the file
        // is the ELF itself.
        let image = read(&k.vmlinuz)?;
        let x = extract_vmlinux(&image, &k.vmlinuz.display().to_string())?;
        if x.compression == Compression::None {
            return Ok((k.vmlinuz.clone(), x.elf, x.compression));
        }
        let name = k
            .vmlinuz
            .file_name()
            .map_or_else(|| "image".into(), |n| n.to_string_lossy().into_owned());
        let path = cache.join(format!("vmlinux-extracted-from-{name}"));
        write(&path, &x.elf)?;
        return Ok((path, x.elf, x.compression));
    };
    let path = cache.join(format!("vmlinux-{version}"));
    let stamp = cache.join(format!("vmlinux-{version}.compression"));
    if let (Ok(elf), Ok(c)) = (std::fs::read(&path), std::fs::read_to_string(&stamp)) {
        if crate::vmlinux::is_whole_elf(&elf) {
            let c = Compression::ORDER
                .into_iter()
                .chain([Compression::None])
                .find(|x| x.to_string() == c.trim())
                .unwrap_or(Compression::None);
            log::debug!("vmlinux of {version} from the cache {}", path.display());
            return Ok((path, elf, c));
        }
    }
    let image = read(&k.vmlinuz)?;
    let x = extract_vmlinux(&image, &k.vmlinuz.display().to_string())?;
    write(&path, &x.elf)?;
    write(&stamp, x.compression.to_string().as_bytes())?;
    Ok((path, x.elf, x.compression))
}

/// Check that `kallsyms` (named `source_name`) describes `elf`.
pub fn check_kallsyms(
    kallsyms: &str,
    elf: &[u8],
    source_name: &str,
    image: &str,
) -> Result<(), KernelError> {
    let find = |name: &'static str| {
        kallsyms
            .lines()
            .filter(|l| !l.contains('\t'))
            .find_map(|l| {
                let mut f = l.split_ascii_whitespace();
                let (a, _, n) = (f.next()?, f.next()?, f.next()?);
                (n == name)
                    .then(|| u64::from_str_radix(a, 16).ok())
                    .flatten()
            })
            .ok_or(KernelError::MissingSymbol {
                source_name: source_name.to_string(),
                symbol: name,
            })
    };
    let ksize = find("_etext")?.wrapping_sub(find("_text")?);
    let file = object::File::parse(elf).map_err(|source| ImageError::Parse {
        file: image.to_string(),
        source,
    })?;
    let text = file
        .section_by_name(".text")
        .ok_or_else(|| ImageError::NoText {
            file: image.to_string(),
        })?;
    // `_etext` may sit a little after .text's last byte (alignment); the same kernel agrees to
    // within a page.
    let esize = text.size();
    if ksize.abs_diff(esize) > 4096 {
        return Err(KernelError::Mismatch {
            source_name: source_name.to_string(),
            image: image.to_string(),
            ksize,
            esize,
        });
    }
    Ok(())
}

/// The kallsyms of `k`: `user` when given, else the cache, else booted in the VM and cached.
/// Returns the text and where it came from.
pub fn kallsyms_of(
    k: &KernelImage,
    user: Option<&Path>,
    cache: &Path,
    repo: &Path,
) -> Result<(String, String), KernelError> {
    if let Some(p) = user {
        let text = String::from_utf8_lossy(&read(p)?).into_owned();
        return Ok((text, p.display().to_string()));
    }
    let Some(version) = &k.version else {
        return Err(KernelError::NeedKallsyms {
            image: k.vmlinuz.clone(),
        });
    };
    let path = cache.join(format!("kallsyms-{version}"));
    if let Ok(text) = std::fs::read_to_string(&path) {
        log::debug!("kallsyms of {version} from the cache {}", path.display());
        return Ok((
            text,
            format!(
                "/proc/kallsyms of {version} in the VM (cached {})",
                path.display()
            ),
        ));
    }
    let text = kallsyms_from_vm(k, version, repo)?;
    write(&path, text.as_bytes())?;
    Ok((
        text,
        format!("/proc/kallsyms of {version} in the VM (nokaslr)"),
    ))
}

/// The scenario that prints the guest's kallsyms, gzip'd and base64'd, with its MD5.
pub fn kallsyms_scenario() -> String {
    format!("echo {MD5}$(md5sum /proc/kallsyms | cut -d' ' -f1)\necho {BEGIN}\ngzip -c /proc/kallsyms | base64\necho {END}\n")
}

/// Why a console log holds no intact kallsyms dump.
#[derive(Debug, Error)]
pub enum DumpError {
    #[error("no {MD5}line")]
    NoMd5,
    #[error("the dump is not base64 (console noise inside it?)")]
    NotBase64,
    #[error("gunzip of the dump")]
    Gunzip(#[source] std::io::Error),
    #[error("MD5 {got} of the dump differs from the guest's {expected}")]
    Md5 { got: String, expected: String },
}

/// Read the kallsyms dump of [`kallsyms_scenario`] out of a console log.
pub fn parse_kallsyms_dump(console: &str) -> Result<String, DumpError> {
    use std::io::Read;
    let md5 = console
        .lines()
        .find_map(|l| {
            l.trim_end()
                .split_once(MD5)
                .map(|(_, m)| m.trim().to_string())
        })
        .ok_or(DumpError::NoMd5)?;
    let mut b64 = String::new();
    let mut inside = false;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if line.ends_with(BEGIN) {
            inside = true;
        } else if line.ends_with(END) {
            inside = false;
        } else if inside {
            b64.push_str(line.trim());
        }
    }
    let gz = base64_decode(&b64).ok_or(DumpError::NotBase64)?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .map_err(DumpError::Gunzip)?;
    let got = md5_hex(text.as_bytes());
    if got != md5 {
        return Err(DumpError::Md5 { got, expected: md5 });
    }
    Ok(text)
}

fn kallsyms_from_vm(k: &KernelImage, version: &str, repo: &Path) -> Result<String, KernelError> {
    let version = version.to_string();
    let scenario_err = |source| KernelError::VmScenario {
        version: version.clone(),
        source,
    };
    let dir = tempfile::tempdir().map_err(scenario_err)?;
    let scenario = dir.path().join("kallsyms.sh");
    std::fs::write(&scenario, kallsyms_scenario()).map_err(scenario_err)?;
    let opts = vmtest::runner::RunOptions {
        repo: repo.to_path_buf(),
        scenario,
        files: Vec::new(),
        timeout: Duration::from_secs(600),
        load_module: false,
        kernel: Some(k.vmlinuz.clone()),
        keep_initramfs: None,
        append: Vec::new(),
        qemu_args: Vec::new(),
        extra_modules: Vec::new(),
        memory_mib: 512,
    };
    eprintln!("bench: booting {version} in the VM (vmtest) for its /proc/kallsyms ...");
    let mut console = Vec::new();
    let report = vmtest::runner::run(&opts, &mut console).map_err(|e| KernelError::VmRun {
        version: version.clone(),
        source: Box::new(e),
    })?;
    if report.exit_code() != 0 {
        return Err(KernelError::VmFailed {
            version,
            summary: report.summary(opts.timeout),
        });
    }
    parse_kallsyms_dump(&String::from_utf8_lossy(&console))
        .map_err(|source| KernelError::VmDump { version, source })
}

/// Build the vmlinux image: extract, get and check kallsyms, NOP the ftrace sites.
pub fn vmlinux_image(
    k: &KernelImage,
    user_kallsyms: Option<&Path>,
    cache: &Path,
    repo: &Path,
) -> Result<(CodeImage, Sources), KernelError> {
    let (path, elf, compression) = vmlinux_of(k, cache)?;
    let (ks, ks_source) = kallsyms_of(k, user_kallsyms, cache, repo)?;
    let name = format!("vmlinux {}", k.label());
    check_kallsyms(&ks, &elf, &ks_source, &name)?;
    let img = CodeImage::vmlinux(&elf, &ks, &name)?;
    Ok((
        img,
        Sources {
            vmlinuz: k.vmlinuz.clone(),
            compression,
            vmlinux: path,
            kallsyms: ks_source,
        },
    ))
}

/// Where the vmlinux analysis came from, for the reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sources {
    pub vmlinuz: PathBuf,
    pub compression: Compression,
    /// The extracted file (also what `objdump -d` reads).
    pub vmlinux: PathBuf,
    pub kallsyms: String,
}

/// The network driver module `name` (file name without `.ko*`, or a path to a `.ko`) of `k`.
pub fn net_driver(k: &KernelImage, name: &str) -> Result<CodeImage, KernelError> {
    let path = if Path::new(name).is_file() {
        PathBuf::from(name)
    } else {
        let dir = k.modules.join("kernel/drivers/net");
        find_module(&dir, name).ok_or(KernelError::NoDriver {
            name: name.to_string(),
            dir,
        })?
    };
    let data = read(&path)?;
    let data = crate::vmlinux::decompress_whole(&data).unwrap_or(data);
    Ok(CodeImage::elf_file(&data, &path.display().to_string())?)
}

fn find_module(dir: &Path, name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut subdirs = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            subdirs.push(p);
        } else if let Some(f) = p.file_name().and_then(|f| f.to_str()) {
            let stem = f.split(".ko").next().unwrap_or(f);
            if f.contains(".ko")
                && (stem == name || stem.replace('-', "_") == name.replace('-', "_"))
            {
                return Some(p);
            }
        }
    }
    subdirs.sort();
    subdirs.iter().find_map(|d| find_module(d, name))
}

/// Standard base64 (RFC 4648, padding optional, whitespace ignored).
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace()) {
        if c == b'=' {
            break;
        }
        acc = (acc << 6) | val(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

/// MD5 (RFC 1321) as lowercase hex: the guest's busybox `md5sum` is the only checksum tool
/// it has.
pub fn md5_hex(data: &[u8]) -> String {
    const S: [u32; 64] = [
        7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9, 14, 20, 5, 9, 14, 20, 5,
        9, 14, 20, 5, 9, 14, 20, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 6, 10,
        15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21,
    ];
    // K[i] = floor(|sin(i + 1)| * 2^32): always in [0, 2^32), so the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let k: Vec<u32> = (0..64)
        .map(|i: i32| ((f64::from(i + 1)).sin().abs() * 4_294_967_296.0) as u32)
        .collect();
    let (mut a0, mut b0, mut c0, mut d0) = (
        0x6745_2301u32,
        0xefcd_ab89u32,
        0x98ba_dcfeu32,
        0x1032_5476u32,
    );
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_le_bytes());
    for chunk in msg.chunks_exact(64) {
        let m: Vec<u32> = chunk
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        let (mut a, mut b, mut c, mut d) = (a0, b0, c0, d0);
        for i in 0..64 {
            let (f, g) = match i / 16 {
                0 => ((b & c) | (!b & d), i),
                1 => ((d & b) | (!d & c), (5 * i + 1) % 16),
                2 => (b ^ c ^ d, (3 * i + 5) % 16),
                _ => (c ^ (b | !d), (7 * i) % 16),
            };
            let f = f.wrapping_add(a).wrapping_add(k[i]).wrapping_add(m[g]);
            a = d;
            d = c;
            c = b;
            b = b.wrapping_add(f.rotate_left(S[i]));
        }
        a0 = a0.wrapping_add(a);
        b0 = b0.wrapping_add(b);
        c0 = c0.wrapping_add(c);
        d0 = d0.wrapping_add(d);
    }
    let mut out = String::with_capacity(32);
    for w in [a0, b0, c0, d0] {
        for byte in w.to_le_bytes() {
            let _ = std::fmt::Write::write_fmt(&mut out, format_args!("{byte:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_the_rfc_1321_test_vectors() {
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_hex(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(
            md5_hex(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "57edf4a22be3c955ac49da2e2107b67a"
        );
    }

    #[test]
    fn base64_decodes_across_lines() {
        assert_eq!(base64_decode("aGVs\nbG8=").unwrap(), b"hello");
        assert!(base64_decode("a$b").is_none());
    }

    #[test]
    fn kallsyms_dump_is_read_back_from_a_noisy_console() {
        use std::io::Write as _;
        let text = "ffffffff81000000 T _text\nffffffff81000010 t f\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(text.as_bytes()).unwrap();
        let b64 = base64_encode_for_test(&gz.finish().unwrap());
        let console = format!(
            "[ 1.0] boot noise\n{MD5}{}\r\n{BEGIN}\r\n{b64}\r\n{END}\r\nTRAPVEC-VMTEST-EXIT=0\n",
            md5_hex(text.as_bytes())
        );
        assert_eq!(parse_kallsyms_dump(&console).unwrap(), text);
        let bad = console.replace(&md5_hex(text.as_bytes()), "00");
        assert!(
            matches!(parse_kallsyms_dump(&bad).unwrap_err(), DumpError::Md5 { got, .. } if got == md5_hex(text.as_bytes()))
        );
    }

    fn base64_encode_for_test(data: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in data.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }

    #[test]
    fn kallsyms_of_another_kernel_is_refused() {
        let elf = std::fs::read("/bin/true").unwrap();
        let ks = "0000000000001000 T _text\n0000000000901000 T _etext\n";
        let err = check_kallsyms(ks, &elf, "host", "true").unwrap_err();
        assert!(matches!(err, KernelError::Mismatch { .. }), "{err}");
    }
}
