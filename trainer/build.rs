//! Embeds an rpath to the libtorch that torch-sys linked (the project's `.venv`), so the tests and
//! binaries run without a hand-set `LD_LIBRARY_PATH`, and passes the path on to the root package.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        // Read by the root package's build script as DEP_ARC_REC_TRAINER_LIBTORCH_LIB.
        println!("cargo:libtorch_lib={lib}");
    }
}
