//! Gives the `arc-rec` binary and tests an rpath to libtorch when the `rft` feature links it, so
//! they run without a hand-set `LD_LIBRARY_PATH` (which still wins where set, e.g. on a GPU box).
//! `libtorch_cuda.so` is deliberately not forced into the binary's NEEDED list (trainer/build.rs
//! does that for its own tests only): `trainer::device::Runtime::select` loads it with dlopen when
//! a command may use CUDA, so `serve` and the other commands do not carry it.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_ARC_REC_TRAINER_LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=sql");
    if let Ok(lib) = std::env::var("DEP_ARC_REC_TRAINER_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
