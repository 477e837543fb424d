//! `RendezvousEnv`: the five variables torchrun sets for each process
//! (<https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables>).

use crate::error::{DistError, Result};

/// Where a process stands in the job, read from torchrun's environment: `RANK` (global rank,
/// `0..WORLD_SIZE`), `WORLD_SIZE` (processes in the job, ≥ 1), `LOCAL_RANK` (rank on this node;
/// the GPU index by convention), `MASTER_ADDR` (host of rank 0's store) and `MASTER_PORT` (its
/// TCP port, 1..=65535).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousEnv {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank on this node (the GPU index by convention).
    pub local_rank: usize,
    /// Host name or address of rank 0.
    pub master_addr: String,
    /// TCP port of rank 0's store.
    pub master_port: u16,
}

impl RendezvousEnv {
    /// Reads the five variables from the process environment.
    ///
    /// # Errors
    /// [`DistError::MissingEnv`] for an unset variable, [`DistError::InvalidEnv`] for one that
    /// does not parse or is out of range (as [`from_lookup`](Self::from_lookup)).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the five variables through `lookup` (the environment, or a map in tests).
    ///
    /// # Errors
    /// [`DistError::MissingEnv`] for an unset variable; [`DistError::InvalidEnv`] when a
    /// number does not parse, `WORLD_SIZE` is 0, `RANK >= WORLD_SIZE`,
    /// `LOCAL_RANK >= WORLD_SIZE`, `MASTER_PORT` is not in 1..=65535 or `MASTER_ADDR` is
    /// empty.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &'static str| lookup(name).ok_or(DistError::MissingEnv { name });
        let number = |name: &'static str| -> Result<usize> {
            let value = get(name)?;
            value.trim().parse().map_err(|_| DistError::InvalidEnv {
                name,
                value,
                expected: "a non-negative integer".into(),
            })
        };
        let world_size = number("WORLD_SIZE")?;
        if world_size == 0 {
            return Err(DistError::InvalidEnv {
                name: "WORLD_SIZE",
                value: "0".into(),
                expected: "at least 1 (the number of processes in the job)".into(),
            });
        }
        let rank = number("RANK")?;
        if rank >= world_size {
            return Err(DistError::InvalidEnv {
                name: "RANK",
                value: rank.to_string(),
                expected: format!("a rank in 0..{world_size} (WORLD_SIZE={world_size})"),
            });
        }
        let local_rank = number("LOCAL_RANK")?;
        if local_rank >= world_size {
            return Err(DistError::InvalidEnv {
                name: "LOCAL_RANK",
                value: local_rank.to_string(),
                expected: format!("a local rank in 0..{world_size} (WORLD_SIZE={world_size})"),
            });
        }
        let master_addr = get("MASTER_ADDR")?;
        if master_addr.trim().is_empty() {
            return Err(DistError::InvalidEnv {
                name: "MASTER_ADDR",
                value: master_addr,
                expected: "the host name or address of rank 0".into(),
            });
        }
        let port = get("MASTER_PORT")?;
        let master_port = match port.trim().parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(DistError::InvalidEnv {
                    name: "MASTER_PORT",
                    value: port,
                    expected: "a TCP port in 1..=65535".into(),
                })
            }
        };
        Ok(RendezvousEnv {
            rank,
            world_size,
            local_rank,
            master_addr: master_addr.trim().to_string(),
            master_port,
        })
    }

    /// `MASTER_ADDR:MASTER_PORT`.
    pub fn store_addr(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<RendezvousEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RendezvousEnv::from_lookup(|k| map.get(k).cloned())
    }

    const OK: [(&str, &str); 5] = [
        ("RANK", "1"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn reads_torchruns_variables() {
        let e = env(&OK).unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (1, 4, 1));
        assert_eq!(e.store_addr(), "10.0.0.1:29500");
    }

    #[test]
    fn refuses_missing_and_bad_values() {
        let err = env(&OK[..4]).unwrap_err();
        assert!(matches!(
            err,
            DistError::MissingEnv {
                name: "MASTER_PORT"
            }
        ));
        let mut bad = OK;
        bad[0] = ("RANK", "4");
        let err = env(&bad).unwrap_err();
        assert!(matches!(err, DistError::InvalidEnv { name: "RANK", .. }));
        assert!(err.to_string().contains("0..4"), "{err}");
        bad = OK;
        bad[1] = ("WORLD_SIZE", "0");
        assert!(matches!(
            env(&bad).unwrap_err(),
            DistError::InvalidEnv {
                name: "WORLD_SIZE",
                ..
            }
        ));
        bad = OK;
        bad[4] = ("MASTER_PORT", "70000");
        assert!(matches!(
            env(&bad).unwrap_err(),
            DistError::InvalidEnv {
                name: "MASTER_PORT",
                ..
            }
        ));
        bad = OK;
        bad[0] = ("RANK", "-1");
        assert!(matches!(
            env(&bad).unwrap_err(),
            DistError::InvalidEnv { name: "RANK", .. }
        ));
    }
}
