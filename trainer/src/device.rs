//! Device and dtype, chosen once per process and handed to every layer.

use tch::{Device, Kind};

/// Where tensors live and in which precision, decided once at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runtime {
    /// CPU or a CUDA ordinal.
    pub device: Device,
    /// bf16 on CUDA (what 7B training needs to fit), f32 on CPU (exact reference checks).
    pub kind: Kind,
}

/// Which device the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// CUDA device 0 when libtorch sees one, else the CPU.
    #[default]
    Auto,
    /// Always the CPU.
    Cpu,
    /// CUDA; an error when none is available.
    Cuda,
}

/// Why a runtime could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// CUDA was asked for but libtorch sees no CUDA device.
    #[error(
        "CUDA was requested but libtorch sees no CUDA device (is libtorch_cuda linked and a GPU present?)"
    )]
    NoCuda,
}

/// Loads libtorch's CUDA backend (`libtorch_cuda.so`) into the process if it is not there yet,
/// and says whether it is now loaded. The `arc-rec` binary references no symbol of that library,
/// so it is not among its NEEDED entries (forcing it there would add ~235 MB of resident,
/// relocated pages and 0.1 s of start-up to every command, `serve` included); without it libtorch
/// reports no CUDA device. Its static initialisers register the CUDA kernels and hooks, which
/// libtorch looks up on the first CUDA query, so this must run before any: [`Runtime::select`]
/// calls it. The library is found the way the binary finds libtorch (`LD_LIBRARY_PATH`, then its
/// rpath); a CPU-only libtorch has none, which is not an error.
pub fn load_cuda_backend() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        // SAFETY: dlopen is given a NUL-terminated name; the handle is never closed, so the
        // library (whose code libtorch's registries point into) stays mapped for the process.
        let handle = unsafe {
            libc::dlopen(
                c"libtorch_cuda.so".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_GLOBAL,
            )
        };
        !handle.is_null()
    })
}

impl Runtime {
    /// Resolves a request into a device and the dtype that goes with it (loading libtorch's
    /// CUDA backend first unless the CPU was asked for; see [`load_cuda_backend`]).
    pub fn select(request: DeviceRequest) -> Result<Self, RuntimeError> {
        if request != DeviceRequest::Cpu {
            load_cuda_backend();
        }
        let device = match request {
            DeviceRequest::Cpu => Device::Cpu,
            DeviceRequest::Auto => Device::cuda_if_available(),
            DeviceRequest::Cuda if tch::Cuda::is_available() => Device::Cuda(0),
            DeviceRequest::Cuda => return Err(RuntimeError::NoCuda),
        };
        let kind = if device.is_cuda() {
            Kind::BFloat16
        } else {
            Kind::Float
        };
        Ok(Self { device, kind })
    }

    /// A one-line description for logs and `--version`-style output.
    pub fn describe(&self) -> String {
        format!(
            "libtorch on {:?} ({:?}); CUDA devices visible: {}",
            self.device,
            self.kind,
            tch::Cuda::device_count()
        )
    }
}

#[cfg(test)]
mod tests {
    use tch::Tensor;

    use super::*;

    #[test]
    fn the_cuda_backend_loads_exactly_when_libtorch_ships_one() {
        let lib = std::path::Path::new(env!("ARC_REC_LIBTORCH_LIB"));
        let shipped = lib.join("libtorch_cuda.so").exists();
        assert_eq!(load_cuda_backend(), shipped, "{}", lib.display());
        assert_eq!(
            load_cuda_backend(),
            shipped,
            "a second call answers the same"
        );
        // With no GPU here, auto still resolves to the CPU once the backend is in.
        if !tch::Cuda::is_available() {
            assert_eq!(
                Runtime::select(DeviceRequest::Auto).unwrap().device,
                Device::Cpu
            );
        }
    }

    /// Proves the libtorch link end to end: a real op and a backward pass on the CPU.
    #[test]
    fn matmul_and_backward_on_cpu() {
        let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
        assert_eq!(runtime.kind, Kind::Float);
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0])
            .reshape([2, 2])
            .set_requires_grad(true);
        let w = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.25]).reshape([2, 2]);
        // x @ w = [[4.5, -0.5], [9.5, -2]], so loss = sum((x @ w)^2) = 114.75 and d/dx = 2 (x @ w) @ w^T.
        let y = x.matmul(&w);
        let loss = (&y * &y).sum(Kind::Float);
        loss.backward();
        let grad = x.grad();
        let expected = (&y * 2.0).matmul(&w.tr());
        let diff = (grad - expected).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "gradient mismatch {diff}");
        assert!(
            (loss.double_value(&[]) - 114.75).abs() < 1e-4,
            "loss {}",
            loss.double_value(&[])
        );
    }
}
