//! Components through the splicer: loading answers `__trapvec_orig_*` imports with original
//! trampolines ([`super::orig`]); unloading is refused while a splice uses the component.

use component_manager::{ComponentId, LoadOptions};
use trapvec::Target;

use super::orig::OrigStubs;
use super::{SpliceError, Splicer};

impl<T: Target> Splicer<T> {
    /// Load a component, answering `__trapvec_orig_*` imports with original trampolines.
    pub fn load_component(
        &mut self,
        path: &std::path::Path,
        opts: &LoadOptions,
    ) -> Result<ComponentId, SpliceError> {
        let mut extra = OrigStubs {
            orig: &mut self.orig,
            live: &self.live,
        };
        Ok(self
            .components
            .load_path(&mut self.target, path, opts, &mut extra)?)
    }

    /// Unload a component (refused while a splice uses it).
    pub fn unload_component(&mut self, id: ComponentId) -> Result<(), SpliceError> {
        Ok(self.components.unload(&mut self.target, id)?)
    }
}
