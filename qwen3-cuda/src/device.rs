//! `--device` values: `cpu`, `cuda` (device 0) or `cuda:N`.

use std::fmt;
use std::str::FromStr;

/// Where the forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    /// A CUDA device by ordinal (the order `nvidia-smi` lists them, unless CUDA_VISIBLE_DEVICES
    /// says otherwise).
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n.parse::<usize>().map(Device::Cuda).map_err(|_| {
                    format!("invalid device {s:?}: expected cuda:N with N a device number")
                }),
                None => Err(format!(
                    "invalid device {s:?}: expected cpu, cuda or cuda:N"
                )),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Whether this build can run on a CUDA device at all. `Err` carries the one line to print when
/// the user asked for `--device cuda` on a build without the `cuda` feature. A build with the
/// feature still has to find a driver: see `cuda::CudaRuntime::open`, which probes before any use.
pub fn cuda_support() -> Result<(), String> {
    if cfg!(feature = "cuda") {
        Ok(())
    } else {
        Err("this qwen3 was built without CUDA support; rebuild with `cargo build --release --features cuda`".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_strings() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("cuda".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:0".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA", "cuda1", ""] {
            let err = bad.parse::<Device>().unwrap_err();
            assert!(
                err.contains("invalid device") && !err.contains('\n'),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn cuda_support_matches_the_feature() {
        assert_eq!(cuda_support().is_ok(), cfg!(feature = "cuda"));
    }
}
