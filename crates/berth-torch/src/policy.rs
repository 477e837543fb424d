//! The policies a PyTorch process can install, by the names `berth_torch.use_allocator` takes.

use berth_alloc::{AllocatorConfig, ConfigError};

/// Which of berth's device-memory policies serves PyTorch's allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// PyTorch's own caching allocator, byte for byte (`backend:native`): same segments, same
    /// reserved bytes, same number of `cudaMalloc` calls as PyTorch's default.
    Pytorch,
    /// PyTorch's caching allocator with expandable segments (`expandable_segments:True`).
    Expandable,
    /// berth's own policy ([`berth_alloc::PagedBestFit`], `backend:paged`): best fit over a
    /// virtual range per stream with physical pages mapped on demand.
    Paged,
}

/// Every policy name [`Policy::parse`] accepts, in the order error messages list them.
pub const POLICY_NAMES: [&str; 3] = ["pytorch", "expandable", "paged"];

/// Why a policy could not be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The name is none of [`POLICY_NAMES`].
    #[error("unknown berth allocator policy {given:?}: use one of \"pytorch\", \"expandable\", \"paged\"")]
    Unknown {
        /// The name given.
        given: String,
    },
    /// The options set a key the policy name decides.
    #[error("allocator option '{key}' is set by the policy name; remove it and pick the policy instead (\"pytorch\", \"expandable\" or \"paged\")")]
    PolicyKey {
        /// The key (`backend` or `expandable_segments`).
        key: &'static str,
    },
    /// The extra options (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax) are malformed or do not
    /// apply to the policy.
    #[error("allocator options for policy {policy:?}: {source}")]
    Config {
        /// The policy the options were given with.
        policy: &'static str,
        /// What was wrong with them.
        #[source]
        source: ConfigError,
    },
}

impl Policy {
    /// The policy named `name` (`"pytorch"`, `"expandable"` or `"paged"`).
    ///
    /// # Errors
    /// [`PolicyError::Unknown`], naming the valid ones.
    pub fn parse(name: &str) -> Result<Policy, PolicyError> {
        match name {
            "pytorch" => Ok(Policy::Pytorch),
            "expandable" => Ok(Policy::Expandable),
            "paged" => Ok(Policy::Paged),
            _ => Err(PolicyError::Unknown {
                given: name.to_owned(),
            }),
        }
    }

    /// The policy's name, as [`Policy::parse`] takes it and `memory_summary` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Pytorch => "pytorch",
            Policy::Expandable => "expandable",
            Policy::Paged => "paged",
        }
    }

    /// The allocator configuration of this policy with `options` added: options of PyTorch's
    /// `PYTORCH_CUDA_ALLOC_CONF` (`max_split_size_mb:512`, `garbage_collection_threshold:0.8`,
    /// ...), empty for none. See
    /// <https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf>.
    ///
    /// # Errors
    /// [`PolicyError::Config`] for malformed options, a `backend:` or `expandable_segments:`
    /// key (the policy sets those), or PyTorch-only options given with `paged`.
    pub fn config(self, options: &str) -> Result<AllocatorConfig, PolicyError> {
        let err = |source| PolicyError::Config {
            policy: self.name(),
            source,
        };
        let extra = options.trim();
        let user = AllocatorConfig::parse(extra).map_err(err)?;
        if user.backend.is_some() {
            return Err(PolicyError::PolicyKey { key: "backend" });
        }
        if extra.contains("expandable_segments") {
            return Err(PolicyError::PolicyKey {
                key: "expandable_segments",
            });
        }
        let base = match self {
            Policy::Pytorch => "backend:native",
            Policy::Expandable => "backend:native,expandable_segments:True",
            Policy::Paged => "backend:paged",
        };
        let full = if extra.is_empty() {
            base.to_owned()
        } else {
            format!("{base},{extra}")
        };
        AllocatorConfig::parse(&full).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for name in POLICY_NAMES {
            assert_eq!(Policy::parse(name).unwrap().name(), name);
        }
        let e = Policy::parse("cudaMallocAsync").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("\"cudaMallocAsync\""), "{msg}");
        for name in POLICY_NAMES {
            assert!(msg.contains(name), "{msg}");
        }
    }

    #[test]
    fn configs_select_the_policy_and_keep_extra_options() {
        let c = Policy::Pytorch.config("").unwrap();
        assert_eq!(c.policy_name(), "pytorch");
        let c = Policy::Expandable.config("").unwrap();
        assert_eq!(c.policy_name(), "expandable");
        let c = Policy::Paged.config(" ").unwrap();
        assert_eq!(c.policy_name(), "paged");
        let c = Policy::Pytorch.config("max_split_size_mb:512").unwrap();
        assert_eq!(c.policy_name(), "pytorch");
        assert_eq!(c.max_split_size, Some(512 << 20));
    }

    #[test]
    fn options_that_fight_the_policy_are_refused() {
        assert_eq!(
            Policy::Pytorch.config("backend:paged"),
            Err(PolicyError::PolicyKey { key: "backend" })
        );
        assert_eq!(
            Policy::Paged.config("expandable_segments:True"),
            Err(PolicyError::PolicyKey {
                key: "expandable_segments"
            })
        );
        assert!(matches!(
            Policy::Pytorch.config("max_split_size_mb:x"),
            Err(PolicyError::Config {
                policy: "pytorch",
                ..
            })
        ));
        // PyTorch-only options do not apply to berth's policy.
        assert!(matches!(
            Policy::Paged.config("max_split_size_mb:512"),
            Err(PolicyError::Config {
                policy: "paged",
                ..
            })
        ));
    }
}
