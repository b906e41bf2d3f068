//! The sets of functions `sizes` and `plan` report on: the groups of vmlinux (by symbol), the
//! whole of vmlinux, a network driver module, and any ELF the user names; each a view of one
//! shared [`CodeImage`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::groups::Group;
use crate::kernel::{self, KernelError, KernelImage, Sources};
use instr_manager::image::{CodeImage, FuncExtent};

/// Functions of one image that are reported together.
#[derive(Clone, Debug)]
pub struct CodeSet {
    /// "scheduler", "vmlinux (all)", "virtio_net.ko", a file name.
    pub name: String,
    /// The whole of vmlinux: too big to plan point by point by default.
    pub whole_kernel: bool,
    /// Where the code came from, for the reports.
    pub source: String,
    pub image: Arc<CodeImage>,
    /// Indices into `image.functions`.
    pub functions: Vec<usize>,
}

impl CodeSet {
    /// Every function of `image`.
    pub fn whole(name: &str, source: &str, image: Arc<CodeImage>) -> CodeSet {
        let functions = (0..image.functions.len()).collect();
        CodeSet {
            name: name.to_string(),
            whole_kernel: false,
            source: source.to_string(),
            image,
            functions,
        }
    }

    /// The functions of `image` in `group`.
    pub fn group(group: &Group, source: &str, image: Arc<CodeImage>) -> CodeSet {
        let functions = image
            .functions
            .iter()
            .enumerate()
            .filter(|(_, f)| f.names.iter().any(|n| group.contains(n)))
            .map(|(i, _)| i)
            .collect();
        CodeSet {
            name: group.name.clone(),
            whole_kernel: false,
            source: source.to_string(),
            image,
            functions,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &FuncExtent> {
        self.functions.iter().map(|&i| &self.image.functions[i])
    }

    /// Keep only the named functions (any of an extent's aliases counts).
    pub fn only(&self, names: &[String]) -> CodeSet {
        let functions = self
            .functions
            .iter()
            .copied()
            .filter(|&i| {
                let f = &self.image.functions[i];
                names.iter().any(|n| f.names.contains(n))
            })
            .collect();
        CodeSet {
            functions,
            ..self.clone()
        }
    }
}

/// What to load.
#[derive(Clone, Debug, Default)]
pub struct SetOptions {
    /// Analyse the installed kernel (`vmlinuz`) at all.
    pub kernel: bool,
    /// A `vmlinuz`/`vmlinux`; default: the newest `/boot/vmlinuz-*-cloud-amd64`.
    pub image: Option<PathBuf>,
    /// A kallsyms file of that kernel; default: from the VM (cached).
    pub kallsyms: Option<PathBuf>,
    pub cache: PathBuf,
    /// The repository vmtest builds from.
    pub repo: PathBuf,
    /// Groups of vmlinux; empty: [`crate::groups::default_groups`].
    pub groups: Vec<Group>,
    /// Network driver module names or paths.
    pub net_drivers: Vec<String>,
    /// Other ELF files.
    pub elfs: Vec<PathBuf>,
}

/// Everything loaded.
pub struct Loaded {
    pub sets: Vec<CodeSet>,
    /// The whole vmlinux (also in `sets`), for the speed measurement.
    pub vmlinux: Option<Arc<CodeImage>>,
    pub sources: Option<Sources>,
}

/// Load the sets `opts` asks for, in report order: the groups, vmlinux (all), the drivers, the
/// ELF files.
pub fn load(opts: &SetOptions) -> Result<Loaded, KernelError> {
    let mut sets = Vec::new();
    let (mut vmlinux, mut sources) = (None, None);
    if opts.kernel {
        let k = KernelImage::find(opts.image.as_deref())?;
        let (img, src) =
            kernel::vmlinux_image(&k, opts.kallsyms.as_deref(), &opts.cache, &opts.repo)?;
        let img = Arc::new(img);
        let desc = format!(
            "{} ({}), symbols: {}",
            src.vmlinuz.display(),
            src.compression,
            src.kallsyms
        );
        let groups = if opts.groups.is_empty() {
            crate::groups::default_groups()
        } else {
            opts.groups.clone()
        };
        for g in &groups {
            sets.push(CodeSet::group(g, &desc, img.clone()));
        }
        sets.push(CodeSet {
            whole_kernel: true,
            ..CodeSet::whole("vmlinux (all)", &desc, img.clone())
        });
        for d in &opts.net_drivers {
            let drv = Arc::new(kernel::net_driver(&k, d)?);
            let name = Path::new(&drv.name)
                .file_name()
                .map_or(d.clone(), |n| n.to_string_lossy().into_owned());
            let source = format!("network driver {}", drv.name);
            sets.push(CodeSet::whole(&format!("net driver {name}"), &source, drv));
        }
        vmlinux = Some(img);
        sources = Some(src);
    }
    for path in &opts.elfs {
        let img = Arc::new(CodeImage::from_path(path)?);
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        sets.push(CodeSet::whole(&name, &path.display().to_string(), img));
    }
    Ok(Loaded {
        sets,
        vmlinux,
        sources,
    })
}
