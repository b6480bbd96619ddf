//! Embeds an rpath to the libtorch that torch-sys linked (the project's `.venv`), so the tests and
//! binaries run without a hand-set `LD_LIBRARY_PATH`, and passes the path on to the root package.
//!
//! Also forces `libtorch_cuda.so` into this package's test binaries' NEEDED list when that
//! libtorch has one: nothing in our code references a symbol of it (CUDA kernels register
//! themselves from its static initialisers), so the linker's default `--as-needed` drops it, and
//! then libtorch never sees a CUDA device, also in tests that query CUDA before any
//! `Runtime::select`. `rustc-link-arg` reaches only this package's own link targets; the `arc-rec`
//! binary instead loads the library on demand (`device::load_cuda_backend`).

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        if Path::new(&lib).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-L{lib},-ltorch_cuda,--as-needed");
        }
        // Lets device.rs's tests know whether this libtorch has a CUDA backend to load.
        println!("cargo:rustc-env=ARC_REC_LIBTORCH_LIB={lib}");
        // Read by the root package's build script as DEP_ARC_REC_TRAINER_LIBTORCH_LIB.
        println!("cargo:libtorch_lib={lib}");
    }
}
