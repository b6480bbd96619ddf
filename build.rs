//! Gives the `arc-rec` binary and tests an rpath to libtorch when the `rft` feature links it, so
//! they run without a hand-set `LD_LIBRARY_PATH` (which still wins where set, e.g. on a GPU box),
//! and keeps `libtorch_cuda.so` NEEDED when that libtorch has one: no symbol of it is referenced,
//! so `--as-needed` would drop it and libtorch would see no CUDA device (see trainer/build.rs).

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_ARC_REC_TRAINER_LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=sql");
    if let Ok(lib) = std::env::var("DEP_ARC_REC_TRAINER_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        if Path::new(&lib).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-L{lib},-ltorch_cuda,--as-needed");
        }
    }
}
