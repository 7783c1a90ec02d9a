//! Links the guest at its load address with `link.ld`, as a static executable without the C
//! runtime.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-Wl,--build-id=none",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
}
