//! `bench cost`'s trap floors on this host (issue 26, item 7): the 2-byte `int $3` (`CD 03`)
//! beside `int 0xf5` and `int3`. No timing is asserted (a shared machine): the test proves that
//! every floor row is there with a positive cost, and that the SIGTRAP handler told each `CD 03`
//! from each `int3` (`CC`) by the bytes before RIP (`cost::measure` fails otherwise).

#[test]
fn the_cd03_floor_is_measured_beside_0xf5_and_told_from_int3() {
    let t = bench::cost::measure(200, 3, false).unwrap();
    for key in ["floor_sigsegv", "floor_int3", "floor_int3_cd03", "trap"] {
        let row = t.row(key).unwrap_or_else(|| panic!("no {key} row"));
        assert!(row.median > 0.0, "{key}: {}", row.median);
    }
    let r = t.cd03_over_sigsegv().expect("the CD 03 row");
    assert!(r.is_finite() && r > 0.0, "CD 03 / 0xf5 = {r}");
    assert!(t.render().contains("CD 03 floor / 0xF5 floor"));
}
