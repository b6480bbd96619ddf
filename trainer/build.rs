//! Embeds an rpath to the libtorch that torch-sys linked (the project's `.venv`), so the tests and
//! binaries run without a hand-set `LD_LIBRARY_PATH`, and passes the path on to the root package.
//!
//! Also forces `libtorch_cuda.so` into the test binaries' NEEDED list when that libtorch has one:
//! nothing in our code references a symbol of it (CUDA kernels register themselves from its static
//! initialisers), so the linker's default `--as-needed` drops it, and then libtorch never sees a
//! CUDA device at run time. The root package's build script does the same for `arc-rec`, because
//! `rustc-link-arg` only reaches this package's own link targets.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        if Path::new(&lib).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-L{lib},-ltorch_cuda,--as-needed");
        }
        // Read by the root package's build script as DEP_ARC_REC_TRAINER_LIBTORCH_LIB.
        println!("cargo:libtorch_lib={lib}");
    }
}
