use super::*;

fn info(has_fentry: bool) -> TargetInfo {
    // The dispatcher's part does not matter to points: only the fentry site does.
    TargetInfo {
        dispatcher_runs_handlers: false,
        dispatcher_counts_hits: false,
        ..TargetInfo::for_code(has_fentry, "test")
    }
}

fn func(name: &str, addr: u64, size: u64) -> Symbol {
    Symbol {
        name: name.into(),
        addr,
        size,
        kind: SymbolKind::Function,
        origin: None,
        version: None,
    }
}

fn table() -> SymbolTable {
    SymbolTable::new(vec![
        func("compute", 0x1000, 0x40),
        func("tcp_sync_mss", 0x2000, 0), // kallsyms style: extent up to the next function
        func("next", 0x2100, 0x10),
        Symbol {
            name: "counter".into(),
            addr: 0x3000,
            size: 8,
            kind: SymbolKind::Object,
            origin: None,
            version: None,
        },
    ])
}

#[test]
fn parses_symbol_offset_and_address_forms() {
    assert_eq!(
        "compute".parse::<PointSpec>().unwrap(),
        PointSpec::Symbol {
            name: "compute".into(),
            offset: 0,
            object: None,
            version: None,
            addr: None
        }
    );
    assert_eq!(
        "compute+0x10".parse::<PointSpec>().unwrap(),
        PointSpec::Symbol {
            name: "compute".into(),
            offset: 16,
            object: None,
            version: None,
            addr: None
        }
    );
    assert_eq!(
        "compute+16".parse::<PointSpec>().unwrap(),
        PointSpec::Symbol {
            name: "compute".into(),
            offset: 16,
            object: None,
            version: None,
            addr: None
        }
    );
    assert_eq!(
        "foo.isra.0+4".parse::<PointSpec>().unwrap(),
        PointSpec::Symbol {
            name: "foo.isra.0".into(),
            offset: 4,
            object: None,
            version: None,
            addr: None
        }
    );
    assert_eq!(
        "0xffffffff81000000".parse::<PointSpec>().unwrap(),
        PointSpec::Address(0xffff_ffff_8100_0000)
    );
    assert_eq!(
        PointSpec::Symbol {
            name: "f".into(),
            offset: 16,
            object: None,
            version: None,
            addr: None
        }
        .to_string(),
        "f+0x10"
    );
}

#[test]
fn parse_errors_name_the_text() {
    for bad in ["", "+4", "f+x", "f+", "0xzz", "0x10+4", "1234", "a b"] {
        let err = bad.parse::<PointSpec>().unwrap_err();
        assert!(
            matches!(&err, PlanError::BadPointSpec { text, .. } if text == bad),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
    }
}

#[test]
fn resolves_symbol_offset_to_site_with_extent() {
    let p = resolve_point(
        &"compute+0x10".parse().unwrap(),
        &table(),
        &info(false),
        |_| 5,
    )
    .unwrap();
    assert_eq!(p.site, 0x1010);
    assert_eq!(
        (p.function.name.as_str(), p.function.size),
        ("compute", 0x40)
    );
    // kallsyms-style symbol: extent filled from the next function.
    let p = resolve_point(
        &"tcp_sync_mss+4".parse().unwrap(),
        &table(),
        &info(false),
        |_| 5,
    )
    .unwrap();
    assert_eq!(p.function.size, 0x100);
}

#[test]
fn resolves_an_address_to_its_containing_function() {
    let p = resolve_point(&PointSpec::Address(0x2104), &table(), &info(false), |_| 5).unwrap();
    assert_eq!(
        (p.function.name.as_str(), p.site, p.function.size),
        ("next", 0x2104, 0x10)
    );
    let err =
        resolve_point(&PointSpec::Address(0x5000), &table(), &info(false), |_| 5).unwrap_err();
    assert!(matches!(err, PlanError::NoFunctionAt { addr: 0x5000, .. }));
}

#[test]
fn entry_point_moves_past_fentry_only_with_has_fentry_and_a_fentry_site() {
    let spec: PointSpec = "tcp_sync_mss".parse().unwrap();
    let p = resolve_point(&spec, &table(), &info(true), |a| {
        if a == 0x2000 {
            5
        } else {
            0
        }
    })
    .unwrap();
    assert_eq!(p.site, 0x2005);
    let p = resolve_point(&spec, &table(), &info(true), |_| 0).unwrap();
    assert_eq!(p.site, 0x2000, "no fentry call at the entry: stays");
    let p = resolve_point(&spec, &table(), &info(false), |_| 5).unwrap();
    assert_eq!(p.site, 0x2000, "user space has no fentry");
    let p = resolve_point(
        &"tcp_sync_mss+1".parse().unwrap(),
        &table(),
        &info(true),
        |_| 5,
    )
    .unwrap();
    assert_eq!(p.site, 0x2001, "only offset 0 moves");
}

/// kallsyms after boot, in the shape of 6.1's: vmlinux's init memory between `__init_begin`
/// and `__init_end` (data symbols), `__init` functions still listed in it, a function before
/// and after it, and a module function whose address happens to fall in the range.
fn kernel_with_init() -> SymbolTable {
    let data = |name: &str, addr: u64| Symbol {
        kind: SymbolKind::Object,
        ..func(name, addr, 0)
    };
    SymbolTable::new(vec![
        func("tcp_v4_rcv", 0x1000, 0),
        data("__init_begin", 0x8000),
        func("tcp_init", 0x8100, 0),
        func("ip_init", 0x8200, 0),
        data("__init_end", 0x9000),
        func("tcp_close", 0x9000, 0),
        func("_etext", 0xa000, 0),
        Symbol {
            origin: Some("tv_mod".into()),
            ..func("tv_mod_fn", 0x8300, 0x40)
        },
    ])
}

#[test]
fn a_kernel_function_in_freed_init_memory_is_refused_before_its_bytes_are_read() {
    let t = kernel_with_init();
    assert_eq!(freed_init(&t), Some((0x8000, 0x9000)));
    let read = std::cell::Cell::new(0);
    let entry_len = |_| {
        read.set(read.get() + 1);
        5
    };
    for point in ["tcp_init", "ip_init+0x10", "0x8105"] {
        let err = resolve_point(&point.parse().unwrap(), &t, &info(true), entry_len).unwrap_err();
        assert!(
            matches!(err, PlanError::InitFreed { .. }),
            "{point}: {err:?}"
        );
        assert_eq!(err.cause(), Some(crate::RefusalCause::InitFreed), "{point}");
        assert!(
            err.to_string().contains("init code") && err.to_string().contains("freed after boot"),
            "{err}"
        );
    }
    assert_eq!(read.get(), 0, "nothing read at a freed function's entry");
    assert_eq!(crate::RefusalCause::InitFreed.name(), "init_freed");
    assert_eq!(
        crate::RefusalCause::InitFreed.summary(),
        "init code, freed after boot"
    );
    // Either side of the range, a module's function, and a process: resolved as before.
    for point in ["tcp_v4_rcv", "tcp_close", "tv_mod:tv_mod_fn"] {
        let p = resolve_point(&point.parse().unwrap(), &t, &info(true), |_| 5).unwrap();
        assert_eq!(p.site, p.function.addr + 5, "{point}");
    }
    let p = resolve_point(&"tcp_init".parse().unwrap(), &t, &info(false), |_| 0).unwrap();
    assert_eq!(p.site, 0x8100, "not a kernel: no init memory");
    // A table without the two symbols has no init range.
    assert_eq!(freed_init(&table()), None);
}

#[test]
fn resolution_errors_name_symbol_and_offset() {
    let t = table();
    let i = info(false);
    assert!(matches!(
        resolve_point(&"nosuch".parse().unwrap(), &t, &i, |_| 0),
        Err(PlanError::UnknownSymbol { .. })
    ));
    assert!(matches!(
        resolve_point(&"counter".parse().unwrap(), &t, &i, |_| 0),
        Err(PlanError::NotAFunction { addr: 0x3000, .. })
    ));
    let err = resolve_point(&"compute+0x40".parse().unwrap(), &t, &i, |_| 0).unwrap_err();
    assert!(matches!(
        err,
        PlanError::OffsetPastEnd {
            offset: 0x40,
            size: 0x40,
            ..
        }
    ));
    assert!(err.to_string().contains("compute"), "{err}");
    let lone = SymbolTable::new(vec![func("last", 0x9000, 0)]);
    assert!(matches!(
        resolve_point(&"last".parse().unwrap(), &lone, &i, |_| 0),
        Err(PlanError::UnknownExtent { .. })
    ));
}

fn lib(name: &str, addr: u64, origin: &str, version: Option<&str>) -> Symbol {
    Symbol {
        origin: Some(origin.into()),
        version: version.map(Into::into),
        ..func(name, addr, 0x20)
    }
}

/// A process as the loader sees it: the program, libc with a compatibility `memcpy`, two
/// libraries both defining `helper`, the program and a library both defining `log_msg`.
fn process_table() -> SymbolTable {
    SymbolTable::new(vec![
        func("log_msg", 0x1000, 0x20),
        lib(
            "memcpy",
            0x7000,
            "/lib/x86_64-linux-gnu/libc.so.6",
            Some("@@GLIBC_2.14"),
        ),
        lib(
            "memcpy",
            0x7100,
            "/lib/x86_64-linux-gnu/libc.so.6",
            Some("@GLIBC_2.2.5"),
        ),
        lib("helper", 0x8000, "/usr/lib/libone.so.1", None),
        lib("helper", 0x9000, "/usr/lib/libtwo.so.2", None),
        lib("log_msg", 0x9100, "/usr/lib/libtwo.so.2", None),
        lib("alias_a", 0x9200, "/usr/lib/libtwo.so.2", None),
        lib("alias_a", 0x9200, "/usr/lib/libtwo.so.2", None),
        Symbol {
            kind: SymbolKind::Ifunc,
            ..lib(
                "strlen",
                0x7200,
                "/lib/x86_64-linux-gnu/libc.so.6",
                Some("@@GLIBC_2.2.5"),
            )
        },
    ])
}

fn site_of(text: &str) -> Result<u64, PlanError> {
    resolve_point(&text.parse()?, &process_table(), &info(false), |_| 0).map(|p| p.site)
}

#[test]
fn parses_object_and_version_qualifiers() {
    let p: PointSpec = "/usr/lib/libsqlite3.so.0:sqlite3_step+0x10"
        .parse()
        .unwrap();
    assert_eq!(
        p,
        PointSpec::Symbol {
            name: "sqlite3_step".into(),
            offset: 16,
            object: Some("/usr/lib/libsqlite3.so.0".into()),
            version: None,
            addr: None
        }
    );
    assert_eq!(p.to_string(), "/usr/lib/libsqlite3.so.0:sqlite3_step+0x10");
    // A `+` in the object's name is the name's, not the offset's.
    let p: PointSpec = "libstdc++.so.6:_ZSt9terminatev+0x4".parse().unwrap();
    assert_eq!(
        p,
        PointSpec::Symbol {
            name: "_ZSt9terminatev".into(),
            offset: 4,
            object: Some("libstdc++.so.6".into()),
            version: None,
            addr: None
        }
    );
    assert_eq!(p.to_string(), "libstdc++.so.6:_ZSt9terminatev+0x4");
    let p: PointSpec = "pthread_cond_wait@GLIBC_2.3.2".parse().unwrap();
    assert_eq!(
        p,
        PointSpec::Symbol {
            name: "pthread_cond_wait".into(),
            offset: 0,
            object: None,
            version: Some("GLIBC_2.3.2".into()),
            addr: None
        }
    );
    assert_eq!(
        "memcpy@@GLIBC_2.14"
            .parse::<PointSpec>()
            .unwrap()
            .to_string(),
        "memcpy@GLIBC_2.14"
    );
    for bad in [":f", "lib:", "f@", "f@a@b", "lib:+4"] {
        let err = bad.parse::<PointSpec>().unwrap_err();
        assert!(
            matches!(&err, PlanError::BadPointSpec { text, .. } if text == bad),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn name_at_an_address_parses_prints_and_names_one_copy() {
    let p: PointSpec = "tv_mod:id_show@0xffffffff81002000+4".parse().unwrap();
    assert_eq!(
        p,
        PointSpec::Symbol {
            name: "id_show".into(),
            offset: 4,
            object: Some("tv_mod".into()),
            version: None,
            addr: Some(0xffff_ffff_8100_2000),
        }
    );
    assert_eq!(p.to_string(), "tv_mod:id_show@0xffffffff81002000+0x4");
    for bad in ["f@0x", "f@0xzz", "f@0x10@0x20"] {
        let err = bad.parse::<PointSpec>().unwrap_err();
        assert!(
            matches!(&err, PlanError::BadPointSpec { text, .. } if text == bad),
            "{bad}: {err:?}"
        );
    }
    // Two static functions of one name (kallsyms repeats it): the name alone is ambiguous,
    // each copy is named by its address, and an address with no copy is refused naming both.
    let t = SymbolTable::new(vec![
        func("id_show", 0x1000, 0x20),
        func("id_show", 0x2000, 0x20),
        func("other", 0x3000, 0x20),
    ]);
    let resolve = |p: &str| resolve_point(&p.parse().unwrap(), &t, &info(true), |_| 5);
    assert!(matches!(
        resolve("id_show"),
        Err(PlanError::Ambiguous { .. })
    ));
    for (p, site) in [("id_show@0x1000", 0x1005), ("id_show@0x2000+0x8", 0x2008)] {
        let r = resolve(p).unwrap();
        assert_eq!((r.function.name.as_str(), r.site), ("id_show", site), "{p}");
    }
    let err = resolve("id_show@0x3000").unwrap_err();
    assert_eq!(err.cause(), Some(crate::RefusalCause::NotAtAddress));
    assert_eq!(
        err.to_string(),
        "point `id_show@0x3000`: no `id_show` at 0x3000 (it is at id_show@0x1000, id_show@0x2000)"
    );
    assert!(matches!(
        resolve("nosuch@0x1000"),
        Err(PlanError::UnknownSymbol { .. })
    ));
}

#[test]
fn in_a_process_a_copy_is_named_by_its_address_in_its_file_too() {
    // A PIE program (bias 0x5555_0000_0000) and a library (bias 0x7f00_0000_0000), each with
    // two static `helper`s: the file address (what `nm` prints, the same every run) names one
    // copy as the run-time address does; a library's file address is its own, not the
    // program's.
    const PIE: u64 = 0x5555_0000_0000;
    const LIB: u64 = 0x7f00_0000_0000;
    let lib = |name: &str, addr: u64| Symbol {
        origin: Some("/usr/lib/libx.so.1".into()),
        ..func(name, LIB + addr, 0x20)
    };
    let t = SymbolTable::new(vec![
        func("helper", PIE + 0x1100, 0x20),
        func("helper", PIE + 0x1200, 0x20),
        lib("helper", 0x1100),
        lib("helper", 0x1300),
    ])
    .with_load_biases(vec![(None, PIE), (Some("/usr/lib/libx.so.1".into()), LIB)]);
    let resolve = |p: &str| resolve_point(&p.parse().unwrap(), &t, &info(false), |_| 0);
    for (p, site) in [
        ("helper@0x1200+0x4", PIE + 0x1204),
        ("helper@0x555500001100", PIE + 0x1100),
        ("libx:helper@0x1300+0x8", LIB + 0x1308),
        ("libx:helper@0x1100", LIB + 0x1100),
        // Unqualified, 0x1100 is a copy's file address in the program and in libx: the
        // program's, as an unqualified name binds.
        ("helper@0x1100", PIE + 0x1100),
    ] {
        assert_eq!(resolve(p).unwrap().site, site, "{p}");
    }
    let f = t.lookup_all("helper");
    assert_eq!(
        f.iter().map(|s| t.file_address(s)).collect::<Vec<_>>(),
        [Some(0x1100), Some(0x1200), Some(0x1100), Some(0x1300)]
    );
    // glibc's `lio_listio`: two versions at one address and a compatibility copy at another;
    // the file address of the first names one function, not an ambiguous pair.
    let glibc = |version: &str, addr: u64| Symbol {
        version: Some(version.into()),
        ..lib("lio_listio", addr)
    };
    let v = SymbolTable::new(vec![
        glibc("@GLIBC_2.4", 0x938c0),
        glibc("@@GLIBC_2.34", 0x938c0),
        glibc("@GLIBC_2.2.5", 0x150160),
    ])
    .with_load_biases(vec![(Some("/usr/lib/libx.so.1".into()), LIB)]);
    let at = |p: &str| resolve_point(&p.parse().unwrap(), &v, &info(false), |_| 0);
    assert_eq!(
        at("libx:lio_listio@0x938c0+0x5").unwrap().site,
        LIB + 0x938c5
    );
    assert_eq!(at("lio_listio@0x150160").unwrap().site, LIB + 0x150160);
    // An object the table has no bias for: only its run-time address names a copy.
    let bare = SymbolTable::new(vec![func("helper", PIE + 0x1100, 0x20)]);
    assert_eq!(bare.file_address(bare.lookup_all("helper")[0]), None);
    let err = resolve("libx:helper@0x1200").unwrap_err();
    assert_eq!(err.cause(), Some(crate::RefusalCause::NotAtAddress));
    assert!(
        err.to_string()
            .contains("/usr/lib/libx.so.1:helper@0x7f0000001300 (0x1300 in its file)"),
        "{err}"
    );
}

#[test]
fn unqualified_names_bind_as_a_link_would() {
    assert_eq!(
        site_of("memcpy").unwrap(),
        0x7000,
        "the default version, not the hidden one"
    );
    assert_eq!(site_of("memcpy@GLIBC_2.2.5").unwrap(), 0x7100);
    assert_eq!(
        site_of("log_msg").unwrap(),
        0x1000,
        "the program's definition interposes"
    );
    assert_eq!(
        site_of("alias_a+4").unwrap(),
        0x9204,
        "one address listed twice is one candidate"
    );
}

#[test]
fn qualified_names_pick_the_object_by_path_file_or_file_stem() {
    assert_eq!(site_of("libone.so.1:helper").unwrap(), 0x8000);
    assert_eq!(site_of("/usr/lib/libtwo.so.2:helper").unwrap(), 0x9000);
    assert_eq!(site_of("libtwo:helper").unwrap(), 0x9000);
    assert_eq!(
        site_of("libtwo:log_msg").unwrap(),
        0x9100,
        "a library's copy when asked for"
    );
    assert!(object_matches("/lib/x86_64-linux-gnu/libc.so.6", "libc.so"));
    assert!(!object_matches(
        "/lib/x86_64-linux-gnu/libcrypt.so.1",
        "libc"
    ));
}

#[test]
fn ambiguous_names_are_refused_with_every_candidate() {
    let err = site_of("helper").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PlanError::Ambiguous { .. }), "{err:?}");
    assert!(
        msg.contains("/usr/lib/libone.so.1:helper at 0x8000")
            && msg.contains("/usr/lib/libtwo.so.2:helper at 0x9000"),
        "{msg}"
    );
}

#[test]
fn qualifiers_that_match_nothing_say_what_exists() {
    // libone is loaded, without log_msg: say where log_msg is.
    let err = site_of("libone:log_msg").unwrap_err();
    assert!(matches!(err, PlanError::NotInObject { .. }), "{err:?}");
    assert!(err.to_string().contains("libtwo.so.2"), "{err}");
    // Nothing of libthree is loaded: a pending point, which only trapd holds.
    for text in ["libthree:helper", "libthree:no_such_name"] {
        let err = site_of(text).unwrap_err();
        assert!(
            matches!(&err, PlanError::ObjectNotLoaded { object, .. } if object == "libthree"),
            "{err:?}"
        );
        assert!(err.to_string().contains("trapd"), "{err}");
    }
    // A name defined elsewhere: say where, as for an object that is loaded.
    let err = site_of("libthree:log_msg").unwrap_err().to_string();
    assert!(
        err.contains("`log_msg` is in /usr/lib/libtwo.so.2"),
        "{err}"
    );
    let err = site_of("memcpy@GLIBC_9").unwrap_err();
    assert!(matches!(err, PlanError::NoSuchVersion { .. }), "{err:?}");
    assert!(err.to_string().contains("@@GLIBC_2.14"), "{err}");
    let err = site_of("strlen").unwrap_err();
    assert!(
        matches!(err, PlanError::UnresolvedIfunc { addr: 0x7200, .. }),
        "{err:?}"
    );
}

#[test]
fn fentry_site_detection_accepts_call_and_nop5_only() {
    assert!(is_fentry_site(&[0xE8, 0, 0, 0, 0, 0x55]));
    assert!(is_fentry_site(&NOP5));
    assert!(!is_fentry_site(&[0x55, 0x48, 0x89, 0xE5, 0x90]));
    assert!(!is_fentry_site(&[0xE8, 0]));
}

#[test]
fn kernel_entry_is_endbr64_then_the_ftrace_site_each_optional() {
    #[rustfmt::skip]
    let ibt = [
        /*00*/ 0xF3, 0x0F, 0x1E, 0xFA,         // endbr64
        /*04*/ 0x0F, 0x1F, 0x44, 0x00, 0x00,   // nop5 (fentry)
        /*09*/ 0x55,                           // push rbp
    ];
    assert_eq!(kernel_entry_len(&ibt), 9);
    assert_eq!(
        kernel_entry_len(&ibt[..4]),
        4,
        "endbr64 alone (an untraced function)"
    );
    assert_eq!(kernel_entry_len(&ibt[4..]), 5, "6.1: the ftrace site alone");
    assert_eq!(kernel_entry_len(&ibt[9..]), 0);
    assert_eq!(
        kernel_entry_len(&[0xF3, 0x0F, 0x1E]),
        0,
        "a short read holds no endbr64"
    );
    let sealed = [0x66, 0x0F, 0x1F, 0x00, 0x0F, 0x1F, 0x44, 0x00, 0x00, 0x55];
    assert_eq!(
        kernel_entry_len(&sealed),
        9,
        "a sealed endbr64 (6.12's do_group_exit), then the ftrace site"
    );
}
