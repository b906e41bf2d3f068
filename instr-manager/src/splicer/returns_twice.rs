//! Functions that return twice, which a return point must refuse.
//!
//! A return point replaces the return address on top of the stack at the function's entry and
//! keeps one instance per call, popped by its return stub. A function that returns twice for
//! one call breaks both halves of that: `setjmp` and `getcontext` return once when called and
//! again for each `longjmp`/`setcontext` to the saved context, long after the first return
//! consumed the instance (the second return goes through a stub with no instance, or pops
//! another call's); a `vfork` child returns through the same stack frame as its parent, so the
//! child's return pops the parent's instance and writes the shared stack the parent returns
//! through next. The compiler knows these functions by name (GCC's `returns_twice` list:
//! `setjmp`, `sigsetjmp`, `savectx`, `vfork`, `getcontext`, `qsetjmp`, with a leading `_`, `__`
//! or `__x` ignored) because a symbol table does not say it; the planner uses the same rule, on
//! every name the function's address has (glibc's `vfork` is also `__vfork`).

/// What happens at a second return of the function named `name`, if it returns twice.
pub(super) fn returns_twice(name: &str) -> Option<&'static str> {
    // A versioned name (`vfork@GLIBC_2.2.5`) is the function it names.
    let base = name.split('@').next().unwrap_or(name);
    let bare = ["__x", "__", "_"]
        .iter()
        .find_map(|p| base.strip_prefix(p))
        .unwrap_or(base);
    match bare {
        "setjmp" | "sigsetjmp" | "qsetjmp" => {
            Some("it returns again at every longjmp to the context it saved")
        }
        "getcontext" | "savectx" => {
            Some("it returns again at every setcontext to the context it saved")
        }
        "vfork" => {
            Some("its child returns through the parent's own stack frame before the parent does")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::returns_twice;

    #[test]
    fn setjmp_getcontext_and_vfork_under_any_prefix_return_twice_and_their_neighbours_do_not() {
        for n in [
            "setjmp",
            "_setjmp",
            "__sigsetjmp",
            "sigsetjmp",
            "getcontext",
            "vfork",
            "__vfork",
            "savectx",
            "__xsetjmp",
            "vfork@GLIBC_2.2.5",
        ] {
            assert!(returns_twice(n).is_some(), "{n}");
        }
        for n in [
            "longjmp",
            "_longjmp",
            "siglongjmp",
            "setcontext",
            "swapcontext",
            "fork",
            "setjmp_helper",
            "my_vfork",
            "___setjmp",
        ] {
            assert_eq!(returns_twice(n), None, "{n}");
        }
    }
}
