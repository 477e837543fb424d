//! `berth info`: version, CPU cores, CUDA devices.
//!
//! A malformed allocator configuration (`BERTH_ALLOC_CONF`, or PyTorch's `PYTORCH_ALLOC_CONF` /
//! `PYTORCH_CUDA_ALLOC_CONF`) does not hide the rest: the report is printed with the policy
//! line saying which variable does not parse, then the error follows and the status is 2, as
//! for every bad input (newcomer defect 13: only the error was printed).

use berth::cuda;
use serde::Serialize;

/// Arguments of `berth info`.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One CUDA device as `berth info` reports it.
#[derive(Serialize, Debug)]
struct DeviceInfo {
    index: usize,
    name: String,
    /// MiB.
    total_mib: u64,
    /// MiB, device-wide (`cuMemGetInfo`); `None` when the query failed.
    free_mib: Option<u64>,
    compute_capability: String,
    multiprocessors: u32,
}

/// Everything `berth info` prints.
#[derive(Serialize, Debug)]
struct Info {
    berth_version: &'static str,
    cpu_cores: usize,
    cuda_available: bool,
    /// Why CUDA is not available; `None` when it is.
    cuda_unavailable_reason: Option<String>,
    /// The device-memory policy the configuration selects (`paged`, `pytorch`, `expandable`);
    /// `None` when the configuration does not parse.
    allocator_policy: Option<String>,
    /// The variable the configuration was read from (`BERTH_ALLOC_CONF`, else PyTorch's
    /// `PYTORCH_ALLOC_CONF` or `PYTORCH_CUDA_ALLOC_CONF`); `None` when none is set.
    alloc_conf_variable: Option<&'static str>,
    /// Its value (empty when none is set).
    alloc_conf: String,
    /// Why that value does not parse; `None` when it parses (or none is set).
    alloc_conf_error: Option<String>,
    devices: Vec<DeviceInfo>,
}

const MIB: u64 = 1 << 20;

/// The report, and the configuration's error when it does not parse (the report then says so
/// and leaves the policy out).
fn collect() -> anyhow::Result<(Info, Option<cuda::CudaError>)> {
    let reason = cuda::unavailable_reason();
    let variable = berth::alloc::AllocatorConfig::env_variable();
    let (policy, alloc_conf, config_error) = match cuda::memory::config() {
        Ok(c) => (Some(c.policy_name().to_owned()), c.conf_string, None),
        Err(e) => {
            let value = variable
                .and_then(std::env::var_os)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default();
            (None, value, Some(e))
        }
    };
    let mut devices = Vec::new();
    if reason.is_none() {
        for i in 0..cuda::device_count() {
            let p = cuda::get_device_properties(i)?;
            // cuMemGetInfo needs a context on device i: `berth info` names every device.
            let free_mib = cuda::mem_get_info(i)
                .ok()
                .map(|(free, _)| free as u64 / MIB);
            devices.push(DeviceInfo {
                index: i,
                name: p.name,
                total_mib: p.total_memory as u64 / MIB,
                free_mib,
                compute_capability: format!("{}.{}", p.major, p.minor),
                multiprocessors: p.multi_processor_count,
            });
        }
    }
    let info = Info {
        berth_version: env!("CARGO_PKG_VERSION"),
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cuda_available: reason.is_none(),
        cuda_unavailable_reason: reason,
        allocator_policy: policy,
        alloc_conf_variable: variable,
        alloc_conf,
        alloc_conf_error: config_error.as_ref().map(ToString::to_string),
        devices,
    };
    Ok((info, config_error))
}

fn render(info: &Info) -> String {
    let conf = match info.alloc_conf_variable {
        None => "BERTH_ALLOC_CONF unset".to_owned(),
        Some(var) => format!("{var}={}", info.alloc_conf),
    };
    let policy = match &info.allocator_policy {
        Some(policy) => format!("{policy} ({conf}; choose with backend:paged or backend:native)"),
        None => format!("none: {conf} does not parse (the error follows)"),
    };
    let mut out = format!(
        "berth {}\nCPU cores: {}\nCUDA allocator policy: {policy}\n",
        info.berth_version, info.cpu_cores
    );
    match &info.cuda_unavailable_reason {
        Some(reason) => out.push_str(&format!("CUDA: not available ({reason})\n")),
        None => {
            out.push_str(&format!("CUDA devices: {}\n", info.devices.len()));
            for d in &info.devices {
                let free = d.free_mib.map_or("?".to_string(), |f| f.to_string());
                out.push_str(&format!(
                    "  cuda:{}  {}  {} MiB total, {} MiB free, compute capability {}, {} SMs\n",
                    d.index, d.name, d.total_mib, free, d.compute_capability, d.multiprocessors
                ));
            }
        }
    }
    out
}

/// Runs `berth info`.
///
/// # Errors
/// A malformed allocator configuration, after the report (status 2).
pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    let (info, config_error) = collect()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print!("{}", render(&info));
    }
    match config_error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_names_each_device_with_memory_in_mib() {
        let info = Info {
            berth_version: "0.1.0",
            cpu_cores: 16,
            cuda_available: true,
            cuda_unavailable_reason: None,
            allocator_policy: Some("paged".into()),
            alloc_conf_variable: None,
            alloc_conf: String::new(),
            alloc_conf_error: None,
            devices: vec![DeviceInfo {
                index: 0,
                name: "NVIDIA H200".into(),
                total_mib: 143_771,
                free_mib: Some(143_000),
                compute_capability: "9.0".into(),
                multiprocessors: 132,
            }],
        };
        let text = render(&info);
        assert!(text.contains("CPU cores: 16"));
        assert!(text.contains(
            "CUDA allocator policy: paged (BERTH_ALLOC_CONF unset; choose with backend:paged or backend:native)"
        ));
        assert!(text.contains(
            "cuda:0  NVIDIA H200  143771 MiB total, 143000 MiB free, compute capability 9.0, 132 SMs"
        ));
        let from_torch = Info {
            allocator_policy: Some("expandable".into()),
            alloc_conf_variable: Some("PYTORCH_CUDA_ALLOC_CONF"),
            alloc_conf: "expandable_segments:True".into(),
            ..info
        };
        assert!(render(&from_torch).contains(
            "CUDA allocator policy: expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; choose with"
        ));
        let bad = Info {
            allocator_policy: None,
            alloc_conf_variable: Some("BERTH_ALLOC_CONF"),
            alloc_conf: "bogus".into(),
            alloc_conf_error: Some("BERTH_ALLOC_CONF: unrecognized allocator config key".into()),
            ..from_torch
        };
        let text = render(&bad);
        assert!(
            text.contains(
                "CUDA allocator policy: none: BERTH_ALLOC_CONF=bogus does not parse (the error follows)"
            ),
            "{text}"
        );
        assert!(
            text.contains("cuda:0  NVIDIA H200"),
            "the rest is still reported"
        );
    }

    #[test]
    fn unavailable_cuda_prints_the_reason() {
        let (info, _) = collect().unwrap();
        if let Some(reason) = &info.cuda_unavailable_reason {
            assert!(render(&info).contains(&format!("CUDA: not available ({reason})")));
            assert!(info.devices.is_empty());
            let json: serde_json::Value =
                serde_json::from_str(&serde_json::to_string(&info).unwrap()).unwrap();
            assert_eq!(json["cuda_available"], false);
        } else {
            assert_eq!(info.devices.len(), cuda::device_count());
        }
    }
}
