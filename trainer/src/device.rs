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

impl Runtime {
    /// Resolves a request into a device and the dtype that goes with it.
    pub fn select(request: DeviceRequest) -> Result<Self, RuntimeError> {
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
