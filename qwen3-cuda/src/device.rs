//! `--device` values: `cpu`, `cuda` (device 0) or `cuda:N`.

use std::fmt;
use std::str::FromStr;

/// Where the forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    /// The CPU in textbook loops (`qwen3_inference::backend::PlainBackend`): the math to read,
    /// slow.
    Plain,
    /// A CUDA device by ordinal (the order `nvidia-smi` lists them, unless CUDA_VISIBLE_DEVICES
    /// says otherwise).
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "plain" => Ok(Device::Plain),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n.parse::<usize>().map(Device::Cuda).map_err(|_| {
                    format!("invalid device {s:?}: expected cuda:N with N a device number")
                }),
                None => Err(format!(
                    "invalid device {s:?}: expected cpu, plain, cuda or cuda:N"
                )),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Plain => f.write_str("plain"),
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

/// Checks, before anything is loaded, that `device` can be used: always for the CPU; for
/// `cuda:N` that this build has CUDA support, a driver is present and device N exists. The error
/// is one line, for the CLI to print before exiting non-zero.
pub fn check_available(device: Device) -> Result<(), String> {
    match device {
        Device::Cpu | Device::Plain => Ok(()),
        Device::Cuda(n) => {
            cuda_support()?;
            #[cfg(feature = "cuda")]
            {
                let count = crate::cuda::device_count().map_err(|e| e.to_string())?;
                if n >= count {
                    return Err(format!(
                        "no CUDA device cuda:{n} (this machine has {count})"
                    ));
                }
            }
            let _ = n;
            Ok(())
        }
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

    /// The CPU is always available; a CUDA device on a build without the feature (or on a machine
    /// without a driver, like every machine this project is tested on) is a one-line error.
    #[test]
    fn availability() {
        assert_eq!(check_available(Device::Cpu), Ok(()));
        if let Err(e) = check_available(Device::Cuda(1000)) {
            assert!(!e.contains('\n'), "{e}");
            assert!(e.contains("CUDA"), "{e}");
        } else {
            panic!("cuda:1000 cannot exist");
        }
    }
}
