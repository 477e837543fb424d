//! Allocator configuration in `PYTORCH_CUDA_ALLOC_CONF` syntax
//! (`c10/core/AllocatorConfig.cpp`, `c10/cuda/CUDAAllocatorConfig.cpp`).
//!
//! Comma-separated `key:value` pairs, lists in `[...]`, whitespace ignored, unknown keys are
//! errors, booleans exactly `True`/`False`. berth reads it from `BERTH_ALLOC_CONF`.

use crate::error::{ConfigError, PolicyError};
use crate::policy::Policy;

/// The number of power-of-two intervals of `roundup_power2_divisions` (1 MiB to 64 GiB).
pub const ROUNDUP_INTERVALS: usize = 16;

const MIB: u64 = 1 << 20;

/// What `max_split_size_mb` and `max_non_split_rounding_mb` accept.
const MB_EXPECTED: &str = "an integer number of MiB from 20 to 17592186044415 (2^44 - 1)";

const KNOWN_KEYS: &str = "backend, max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, \
garbage_collection_threshold, expandable_segments, release_lock_on_cudamalloc, pinned_use_cuda_host_register, \
pinned_num_register_threads, pinned_use_background_threads, graph_capture_record_stream_reuse";

/// Other spellings PyTorch accepts for keys of [`KNOWN_KEYS`] (its device-generic and `ROCm`
/// names), and the key each stands for.
const KEY_ALIASES: [(&str, &str); 4] = [
    (
        "release_lock_on_device_malloc",
        "release_lock_on_cudamalloc",
    ),
    ("release_lock_on_hipmalloc", "release_lock_on_cudamalloc"),
    (
        "pinned_use_device_host_register",
        "pinned_use_cuda_host_register",
    ),
    (
        "pinned_use_hip_host_register",
        "pinned_use_cuda_host_register",
    ),
];

/// Options of PyTorch's allocator that berth does not implement
/// (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDAAllocatorConfig.h>). Written
/// in `BERTH_ALLOC_CONF` they are an error ([`ConfigError::NotImplemented`]); read from
/// PyTorch's own variables they are skipped with a warning, so that a PyTorch setting does
/// not stop a berth program ([`AllocatorConfig::from_env`]).
pub const PYTORCH_ONLY_KEYS: [&str; 6] = [
    "per_process_memory_fraction",
    "pinned_reserve_segment_size_mb",
    "pinned_free_catch_all",
    "throw_on_cudamalloc_oom",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
];

/// The environment variables the allocator configuration is read from, the first one set
/// winning: berth's own, then PyTorch's two names in PyTorch's order (`PYTORCH_ALLOC_CONF`,
/// then the older `PYTORCH_CUDA_ALLOC_CONF`, as `CUDAAllocatorConfig::instance` reads them:
/// <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDAAllocatorConfig.h>). A PyTorch
/// user's existing setting therefore tunes berth the same way unless `BERTH_ALLOC_CONF`
/// overrides it.
pub const CONFIG_VARIABLES: [&str; 3] = [
    "BERTH_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
];

/// The parsed configuration of a caching allocator. `Default` is PyTorch's default.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AllocatorConfig {
    /// The string it was parsed from (`PYTORCH_CUDA_ALLOC_CONF` in the snapshot's settings).
    pub conf_string: String,
    /// `backend` as written (`None` when the key is absent): `backend:native` is
    /// [`Policy::Pytorch`] (with `expandable_segments:True`, [`AllocatorConfig::policy`] is
    /// [`Policy::Expandable`]), `backend:paged` is [`Policy::Paged`]. PyTorch's other value,
    /// `cudaMallocAsync`, is refused rather than silently replaced.
    pub backend: Option<Policy>,
    /// `max_split_size_mb` in bytes; blocks of at least this size are never split. `None` =
    /// unlimited (the default).
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb` in bytes (default 20 MiB): an oversize block serves only
    /// requests within this many bytes of its size.
    pub max_non_split_rounding_size: u64,
    /// `roundup_power2_divisions` per power-of-two interval: index `i` covers requests of
    /// [2^i, 2^(i+1)) MiB, so the list key `K` (a power of two, in MiB) sets the interval
    /// [K, 2K) MiB; index 0 also takes everything under 1 MiB, index 15 everything from 32 GiB.
    /// PyTorch's documentation states the intervals one off. 0 = off. A list's first named key
    /// also fills every interval below it; a `>` key fills the intervals after the last named
    /// one (from index 1 when it comes first, leaving index 0), as PyTorch's parser does.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` (0 = off; else 0 < t < 1, active only with a memory
    /// fraction set).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `release_lock_on_cudamalloc` (berth never holds its lock during backend malloc; accepted
    /// for compatibility).
    pub release_lock_on_cudamalloc: bool,
    /// `pinned_use_cuda_host_register` (host allocator).
    pub pinned_use_cuda_host_register: bool,
    /// `pinned_num_register_threads` (host allocator; power of two ≤ 128).
    pub pinned_num_register_threads: u64,
    /// `pinned_use_background_threads` (host allocator).
    pub pinned_use_background_threads: bool,
    /// `graph_capture_record_stream_reuse` (recorded only).
    pub graph_capture_record_stream_reuse: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            conf_string: String::new(),
            backend: None,
            max_split_size: None,
            max_non_split_rounding_size: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            graph_capture_record_stream_reuse: false,
        }
    }
}

impl Policy {
    /// The configuration of this policy with `options` added: options of PyTorch's
    /// `PYTORCH_CUDA_ALLOC_CONF` (`max_split_size_mb:512`, `garbage_collection_threshold:0.8`,
    /// ...), empty for none
    /// (<https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf>).
    /// The result selects this policy explicitly ([`AllocatorConfig::policy_chosen`]).
    ///
    /// # Errors
    /// [`PolicyError::Config`] for malformed options or options of PyTorch's policy given with
    /// `paged`; [`PolicyError::PolicyKey`] for a `backend:` or `expandable_segments:` key (the
    /// policy sets those).
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

/// A token of the config string with its byte offset.
#[derive(Debug)]
struct Token<'a> {
    text: &'a str,
    pos: usize,
}

fn tokenize(s: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in s.char_indices() {
        if matches!(c, ',' | ':' | '[' | ']') || c.is_whitespace() {
            if let Some(st) = start.take() {
                tokens.push(Token {
                    text: &s[st..i],
                    pos: st,
                });
            }
            if !c.is_whitespace() {
                tokens.push(Token {
                    text: &s[i..i + 1],
                    pos: i,
                });
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(st) = start {
        tokens.push(Token {
            text: &s[st..],
            pos: st,
        });
    }
    tokens
}

fn invalid(key: &str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.into(),
        value: value.into(),
        expected,
    }
}

/// The most divisions `roundup_power2_divisions` takes per interval (2^32). Rounding with `d`
/// divisions applies only to requests above `512 × d` bytes, so more would never change a size
/// below 2 TiB; and from 2^55 on, `512 × d` no longer fits in 64 bits (found by fuzzing: every
/// size then rounded to a power of two). PyTorch sets no bound.
pub const MAX_ROUNDUP_DIVISIONS: u64 = 1 << 32;

const DIVISIONS_EXPECTED: &str = "0 or a power of two up to 4294967296 (2^32)";

fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(invalid(key, value, "True or False")),
    }
}

fn parse_u64(key: &str, value: &str, expected: &'static str) -> Result<u64, ConfigError> {
    value
        .parse::<u64>()
        .map_err(|_| invalid(key, value, expected))
}

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF`-style string, e.g.
    /// `"expandable_segments:True,max_split_size_mb:128"`. The empty string gives the default.
    ///
    /// # Errors
    /// 1. [`ConfigError::UnknownKey`] naming a key that is not an option.
    /// 2. [`ConfigError::InvalidValue`] naming the key and value that does not fit it.
    /// 3. [`ConfigError::Syntax`] with the byte position of a malformed entry.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        Self::parse_keys(s, false).map(|(cfg, _)| cfg)
    }

    /// [`AllocatorConfig::parse`] for a string written for PyTorch: the keys of
    /// [`PYTORCH_ONLY_KEYS`] are skipped with their values, and returned (in order) instead
    /// of refused.
    ///
    /// # Errors
    /// As [`AllocatorConfig::parse`].
    pub fn parse_pytorch(s: &str) -> Result<(Self, Vec<&'static str>), ConfigError> {
        Self::parse_keys(s, true)
    }

    /// The parser of both spellings: `skip_pytorch_only` skips [`PYTORCH_ONLY_KEYS`].
    fn parse_keys(
        s: &str,
        skip_pytorch_only: bool,
    ) -> Result<(Self, Vec<&'static str>), ConfigError> {
        let mut skipped = Vec::new();
        let mut cfg = AllocatorConfig {
            conf_string: s.to_owned(),
            ..Default::default()
        };
        let tokens = tokenize(s);
        let mut i = 0;
        let syntax = |pos: usize, message: String| ConfigError::Syntax {
            position: pos,
            message,
        };
        while i < tokens.len() {
            let key_tok = &tokens[i];
            if key_tok.text == "," {
                i += 1;
                continue;
            }
            if matches!(key_tok.text, ":" | "[" | "]") {
                return Err(syntax(
                    key_tok.pos,
                    format!("unexpected '{}' where a key was expected", key_tok.text),
                ));
            }
            let key = KEY_ALIASES
                .iter()
                .find(|(alias, _)| *alias == key_tok.text)
                .map_or(key_tok.text, |(_, key)| *key);
            let pytorch_only = PYTORCH_ONLY_KEYS.iter().find(|k| **k == key);
            match pytorch_only {
                Some(k) if !skip_pytorch_only => {
                    return Err(ConfigError::NotImplemented { key: k });
                }
                Some(_) => {}
                None if !KNOWN_KEYS.split(", ").any(|k| k == key) => {
                    return Err(ConfigError::UnknownKey {
                        key: key.into(),
                        known: KNOWN_KEYS,
                    });
                }
                None => {}
            }
            match tokens.get(i + 1) {
                Some(t) if t.text == ":" => {}
                Some(t) => {
                    return Err(syntax(
                        t.pos,
                        format!("expected ':' after key '{key}', found '{}'", t.text),
                    ))
                }
                None => return Err(syntax(s.len(), format!("key '{key}' has no value"))),
            }
            i += 2;
            let Some(value_tok) = tokens.get(i) else {
                return Err(syntax(s.len(), format!("key '{key}' has no value")));
            };
            if let Some(k) = pytorch_only {
                // Skipped with its value: one token, or a bracketed list.
                skipped.push(*k);
                if value_tok.text == "[" {
                    i = tokens[i..]
                        .iter()
                        .position(|t| t.text == "]")
                        .map(|p| i + p + 1)
                        .ok_or_else(|| syntax(s.len(), format!("'{key}': '[' without ']'")))?;
                } else {
                    i += 1;
                }
            } else if value_tok.text == "[" {
                if key != "roundup_power2_divisions" {
                    return Err(invalid(key, "[", "a single value, not a list"));
                }
                i = cfg.parse_division_list(&tokens, i + 1, s.len())?;
            } else {
                if matches!(value_tok.text, "," | ":" | "]") {
                    return Err(syntax(value_tok.pos, format!("key '{key}' has no value")));
                }
                cfg.set(key, value_tok.text)?;
                i += 1;
            }
            if let Some(t) = tokens.get(i) {
                if t.text != "," {
                    return Err(syntax(
                        t.pos,
                        format!(
                            "expected ',' after the value of '{key}', found '{}'",
                            t.text
                        ),
                    ));
                }
            }
        }
        if cfg.backend == Some(Policy::Paged) {
            if let Some(key) = cfg.native_option_set() {
                return Err(ConfigError::NotForBackend {
                    key,
                    backend: "paged",
                });
            }
        }
        Ok((cfg, skipped))
    }

    /// The first option of PyTorch's device policy (`backend:native`) that differs from its
    /// default, if any.
    fn native_option_set(&self) -> Option<&'static str> {
        let d = AllocatorConfig::default();
        [
            ("max_split_size_mb", self.max_split_size != d.max_split_size),
            (
                "max_non_split_rounding_mb",
                self.max_non_split_rounding_size != d.max_non_split_rounding_size,
            ),
            (
                "roundup_power2_divisions",
                self.roundup_power2_divisions != d.roundup_power2_divisions,
            ),
            (
                "garbage_collection_threshold",
                self.garbage_collection_threshold != d.garbage_collection_threshold,
            ),
            ("expandable_segments", self.expandable_segments),
        ]
        .into_iter()
        .find_map(|(key, set)| set.then_some(key))
    }

    /// The policy this configuration selects for device memory: `backend:` when given (with
    /// `expandable_segments:True`, `backend:native` is [`Policy::Expandable`]); else PyTorch's
    /// policy when any of its options is set (so `expandable_segments:True` alone means
    /// PyTorch's expandable segments, as in PyTorch); else [`Policy::DEFAULT`].
    pub fn policy(&self) -> Policy {
        match self.backend {
            Some(Policy::Paged) => Policy::Paged,
            Some(Policy::Expandable) => Policy::Expandable,
            Some(Policy::Pytorch) => self.native_mode(),
            None if self.native_option_set().is_some() => self.native_mode(),
            None => Policy::DEFAULT,
        }
    }

    /// PyTorch's policy in the mode `expandable_segments` selects.
    fn native_mode(&self) -> Policy {
        if self.expandable_segments {
            Policy::Expandable
        } else {
            Policy::Pytorch
        }
    }

    /// Whether the policy was chosen (`backend:` written, or an option of PyTorch's policy
    /// set) rather than left to the default: a chosen policy the device cannot run is an
    /// error, the default falls back (`Note [Policy without virtual memory]` in
    /// [`crate::policy`]).
    pub fn policy_chosen(&self) -> bool {
        self.backend.is_some() || self.native_option_set().is_some()
    }

    /// The policy's name as [`crate::DeviceAllocator::policy_name`] reports it:
    /// [`Policy::name`] of [`AllocatorConfig::policy`].
    pub fn policy_name(&self) -> &'static str {
        self.policy().name()
    }

    /// Parses the first of [`CONFIG_VARIABLES`] that is set (`BERTH_ALLOC_CONF`, else
    /// PyTorch's `PYTORCH_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF`); the default
    /// configuration when none is. From PyTorch's variables, options berth does not implement
    /// ([`PYTORCH_ONLY_KEYS`]) are skipped and said once on the [`crate::warnings`] channel.
    ///
    /// # Errors
    /// [`ConfigError::InVariable`] naming the variable, around [`AllocatorConfig::parse`]'s
    /// error; [`ConfigError::NotUnicode`] for a value that is not UTF-8.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::var)
    }

    /// The variable of [`CONFIG_VARIABLES`] that [`AllocatorConfig::from_env`] reads now
    /// (the first one set), or `None` when none is set.
    pub fn env_variable() -> Option<&'static str> {
        CONFIG_VARIABLES
            .into_iter()
            .find(|var| std::env::var_os(var).is_some())
    }

    /// [`AllocatorConfig::from_env`] over `get`, which answers as `std::env::var` does: the
    /// first variable that is not [`std::env::VarError::NotPresent`] is read; set but not
    /// UTF-8 is [`ConfigError::NotUnicode`] (never read as unset).
    ///
    /// # Errors
    /// As [`AllocatorConfig::from_env`].
    pub fn from_vars(
        get: impl Fn(&'static str) -> Result<String, std::env::VarError>,
    ) -> Result<Self, ConfigError> {
        for var in CONFIG_VARIABLES {
            let value = match get(var) {
                Ok(value) => value,
                Err(std::env::VarError::NotPresent) => continue,
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(ConfigError::NotUnicode { var })
                }
            };
            let in_variable = |error| ConfigError::InVariable {
                var,
                error: Box::new(error),
            };
            if var == CONFIG_VARIABLES[0] {
                return AllocatorConfig::parse(&value).map_err(in_variable);
            }
            let (config, skipped) = AllocatorConfig::parse_pytorch(&value).map_err(in_variable)?;
            if !skipped.is_empty() {
                crate::warnings::warn_once("alloc-conf-pytorch-only-keys", || {
                    format!(
                        "{var}: berth does not implement PyTorch's allocator option(s) {}; \
                         they are ignored (set BERTH_ALLOC_CONF, which is read first, to \
                         configure berth without them)",
                        skipped.join(", ")
                    )
                });
            }
            return Ok(config);
        }
        Ok(AllocatorConfig::default())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "backend" => {
                self.backend = Some(match value {
                    "native" => Policy::Pytorch,
                    "paged" => Policy::Paged,
                    _ => {
                        return Err(invalid(
                            key,
                            value,
                            "one of native (PyTorch's caching allocator) or paged (berth's \
                             paged best fit); berth does not implement cudaMallocAsync",
                        ))
                    }
                })
            }
            "max_split_size_mb" => {
                let mb = parse_u64(key, value, MB_EXPECTED)?;
                // PyTorch's `stoi` throws past `int`'s range; in bytes this must fit a u64.
                if !(20..=u64::MAX / MIB).contains(&mb) {
                    return Err(invalid(key, value, MB_EXPECTED));
                }
                self.max_split_size = Some(mb * MIB);
            }
            "max_non_split_rounding_mb" => {
                let mb = parse_u64(key, value, MB_EXPECTED)?;
                // PyTorch's `stoi` throws past `int`'s range; in bytes this must fit a u64.
                if !(20..=u64::MAX / MIB).contains(&mb) {
                    return Err(invalid(key, value, MB_EXPECTED));
                }
                self.max_non_split_rounding_size = mb * MIB;
            }
            "roundup_power2_divisions" => {
                let v = parse_u64(
                    key,
                    value,
                    "0 or a power of two, or a list like [256:1,>:8]",
                )?;
                if v != 0 && !v.is_power_of_two() || v > MAX_ROUNDUP_DIVISIONS {
                    return Err(invalid(key, value, DIVISIONS_EXPECTED));
                }
                self.roundup_power2_divisions = [v; ROUNDUP_INTERVALS];
            }
            "garbage_collection_threshold" => {
                let t: f64 = value
                    .parse()
                    .map_err(|_| invalid(key, value, "a number with 0 < t < 1"))?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(invalid(key, value, "a number with 0 < t < 1"));
                }
                self.garbage_collection_threshold = t;
            }
            "expandable_segments" => self.expandable_segments = parse_bool(key, value)?,
            "release_lock_on_cudamalloc" => {
                self.release_lock_on_cudamalloc = parse_bool(key, value)?
            }
            "pinned_use_cuda_host_register" => {
                self.pinned_use_cuda_host_register = parse_bool(key, value)?
            }
            "pinned_use_background_threads" => {
                self.pinned_use_background_threads = parse_bool(key, value)?
            }
            "graph_capture_record_stream_reuse" => {
                self.graph_capture_record_stream_reuse = parse_bool(key, value)?
            }
            "pinned_num_register_threads" => {
                let v = parse_u64(key, value, "a power of two ≤ 128")?;
                if !v.is_power_of_two() || v > 128 {
                    return Err(invalid(key, value, "a power of two ≤ 128"));
                }
                self.pinned_num_register_threads = v;
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    key: key.into(),
                    known: KNOWN_KEYS,
                })
            }
        }
        Ok(())
    }

    /// Parses `K:v,...,>:v]` starting after `[`; returns the index after `]`.
    fn parse_division_list(
        &mut self,
        tokens: &[Token<'_>],
        mut i: usize,
        end: usize,
    ) -> Result<usize, ConfigError> {
        const KEY: &str = "roundup_power2_divisions";
        let mut last_index = 0usize;
        let mut first = true;
        loop {
            let Some(bound) = tokens.get(i) else {
                return Err(ConfigError::Syntax {
                    position: end,
                    message: format!("unterminated '[' in {KEY}"),
                });
            };
            if bound.text == "]" {
                return Ok(i + 1);
            }
            match (tokens.get(i + 1), tokens.get(i + 2)) {
                (Some(colon), Some(val)) if colon.text == ":" => {
                    let v = parse_u64(KEY, val.text, DIVISIONS_EXPECTED)?;
                    if v != 0 && !v.is_power_of_two() || v > MAX_ROUNDUP_DIVISIONS {
                        return Err(invalid(KEY, val.text, DIVISIONS_EXPECTED));
                    }
                    if bound.text == ">" {
                        // PyTorch fills from the bucket after the last named one, bucket 1
                        // when none was named: a leading '>' leaves bucket 0 alone, and does
                        // not count as the first value (c10/core/AllocatorConfig.cpp,
                        // `parseRoundUpPower2Divisions`).
                        for d in self
                            .roundup_power2_divisions
                            .iter_mut()
                            .skip(last_index + 1)
                        {
                            *d = v;
                        }
                    } else {
                        let k = parse_u64(
                            KEY,
                            bound.text,
                            "a power-of-two interval start in MiB, or '>'",
                        )?;
                        if !k.is_power_of_two() {
                            return Err(invalid(
                                KEY,
                                bound.text,
                                "a power-of-two interval start in MiB, or '>'",
                            ));
                        }
                        let index = (k.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                        if first {
                            for d in self.roundup_power2_divisions.iter_mut().take(index) {
                                *d = v;
                            }
                        }
                        self.roundup_power2_divisions[index] = v;
                        last_index = index;
                        first = false;
                    }
                }
                _ => {
                    return Err(ConfigError::Syntax {
                        position: bound.pos,
                        message: format!(
                            "expected 'interval:divisions' in {KEY}, found '{}'",
                            bound.text
                        ),
                    })
                }
            }
            i += 3;
            match tokens.get(i) {
                Some(t) if t.text == "," => i += 1,
                Some(t) if t.text == "]" => {}
                Some(t) => {
                    return Err(ConfigError::Syntax {
                        position: t.pos,
                        message: format!("expected ',' or ']' in {KEY}, found '{}'", t.text),
                    })
                }
                None => {
                    return Err(ConfigError::Syntax {
                        position: end,
                        message: format!("unterminated '[' in {KEY}"),
                    })
                }
            }
        }
    }

    /// The `roundup_power2_divisions` entry for a size of `bytes`.
    pub fn divisions_for(&self, bytes: u64) -> u64 {
        let log = 63 - bytes.max(1).leading_zeros() as usize;
        let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }
}

impl std::str::FromStr for AllocatorConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocatorConfig::parse(s)
    }
}

#[cfg(test)]
mod tests {

    /// Found by fuzzing: a variable that is not UTF-8 was read as unset.
    #[cfg(unix)]
    #[test]
    fn non_utf8_env_value_is_refused_not_ignored() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let bad = || std::env::VarError::NotUnicode(OsString::from_vec(vec![0x62, 0xff, 0x3a]));
        let e = AllocatorConfig::from_vars(|_| Err(bad())).unwrap_err();
        assert_eq!(
            e,
            ConfigError::NotUnicode {
                var: "BERTH_ALLOC_CONF"
            }
        );
        assert!(e.to_string().contains("not valid UTF-8"), "{e}");
        // Not UTF-8 in PyTorch's variable is refused too, naming it.
        let e = AllocatorConfig::from_vars(|v| match v {
            "PYTORCH_ALLOC_CONF" => Err(bad()),
            _ => Err(std::env::VarError::NotPresent),
        })
        .unwrap_err();
        assert_eq!(
            e,
            ConfigError::NotUnicode {
                var: "PYTORCH_ALLOC_CONF"
            }
        );
        let unset = AllocatorConfig::from_vars(|_| Err(std::env::VarError::NotPresent));
        assert_eq!(unset, Ok(AllocatorConfig::default()));
    }

    /// Found by fuzzing: 2^55 divisions overflowed `512 × divisions`, and every size
    /// then rounded to a power of two. Refused at parse, in both spellings.
    #[test]
    fn huge_roundup_divisions_are_refused() {
        for s in [
            "roundup_power2_divisions:36028797018963968",
            "roundup_power2_divisions:[256:1,>:36028797018963968]",
            "roundup_power2_divisions:8589934592",
        ] {
            let e = AllocatorConfig::parse(s).unwrap_err();
            assert!(e.to_string().contains("up to 4294967296"), "{s}: {e}");
        }
        let c = AllocatorConfig::parse("roundup_power2_divisions:4294967296").unwrap();
        assert_eq!(c.roundup_power2_divisions[0], MAX_ROUNDUP_DIVISIONS);
        // What rounding does with it: `caching::policy`'s test
        // `the_largest_division_count_rounds_to_512_bytes`.
    }
    use super::*;

    #[test]
    fn configs_select_the_policy_and_keep_extra_options() {
        for p in Policy::ALL {
            let c = p.config(" ").unwrap();
            assert_eq!((c.policy(), c.policy_chosen()), (p, true));
        }
        let c = Policy::Pytorch.config("max_split_size_mb:512").unwrap();
        assert_eq!(c.policy(), Policy::Pytorch);
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

    #[test]
    fn parses_common_keys() {
        let c = AllocatorConfig::parse("expandable_segments:True, max_split_size_mb:128").unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, Some(128 << 20));
    }

    #[test]
    fn division_list_fills_like_pytorch() {
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(
            &c.roundup_power2_divisions[..11],
            &[1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4]
        );
        assert!(c.roundup_power2_divisions[11..].iter().all(|&d| d == 8));
        // A leading '>' fills from bucket 1, not 0, and is not the "first value" that fills
        // the buckets below the first named key (PyTorch's parseRoundUpPower2Divisions).
        let lead = AllocatorConfig::parse("roundup_power2_divisions:[>:4]").unwrap();
        assert_eq!(lead.roundup_power2_divisions[0], 0);
        assert!(lead.roundup_power2_divisions[1..].iter().all(|&d| d == 4));
        let then = AllocatorConfig::parse("roundup_power2_divisions:[>:4,4:8]").unwrap();
        assert_eq!(&then.roundup_power2_divisions[..4], &[8, 8, 8, 4]);
        assert!(then.roundup_power2_divisions[3..].iter().all(|&d| d == 4));
        assert_eq!(
            AllocatorConfig::parse("roundup_power2_divisions:4")
                .unwrap()
                .divisions_for(1200),
            4
        );
    }

    #[test]
    fn errors_name_the_key() {
        let e = AllocatorConfig::parse("max_split_size_mb:abc").unwrap_err();
        assert!(e.to_string().contains("max_split_size_mb"), "{e}");
        let e = AllocatorConfig::parse("expandable_segment:True").unwrap_err();
        assert!(
            matches!(e, ConfigError::UnknownKey { ref key, .. } if key == "expandable_segment")
        );
        let e = AllocatorConfig::parse("expandable_segments:true").unwrap_err();
        assert!(e.to_string().contains("True or False"), "{e}");
        assert!(matches!(
            AllocatorConfig::parse("max_split_size_mb"),
            Err(ConfigError::Syntax { .. })
        ));
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:3]").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:1").is_err());
    }

    #[test]
    fn backend_key_selects_the_policy() {
        let pick = |s: &str| AllocatorConfig::parse(s).map(|c| (c.policy(), c.policy_name()));
        use Policy::{Expandable, Paged, Pytorch};
        assert_eq!(pick("backend:native"), Ok((Pytorch, "pytorch")));
        assert_eq!(pick("backend:paged"), Ok((Paged, "paged")));
        assert_eq!(
            pick("backend:native,expandable_segments:True"),
            Ok((Expandable, "expandable"))
        );
        // Without backend:, an option of PyTorch's policy means PyTorch's policy.
        assert_eq!(
            pick("expandable_segments:True"),
            Ok((Expandable, "expandable"))
        );
        assert_eq!(pick("max_split_size_mb:128"), Ok((Pytorch, "pytorch")));
        // Nothing set: berth's default; host-only options leave it alone.
        assert_eq!(pick("").map(|p| p.0), Ok(Policy::DEFAULT));
        assert_eq!(
            pick("pinned_use_cuda_host_register:True").map(|p| p.0),
            Ok(Policy::DEFAULT)
        );
        assert_eq!(AllocatorConfig::default().policy(), Policy::DEFAULT);
    }

    #[test]
    fn a_bad_backend_names_the_valid_ones() {
        for bad in ["cudaMallocAsync", "Paged", "pytorch", "rmm"] {
            let e = AllocatorConfig::parse(&format!("backend:{bad}")).unwrap_err();
            assert!(
                matches!(&e, ConfigError::InvalidValue { key, value, .. } if key == "backend" && value == bad),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "invalid value '{bad}' for allocator config key 'backend': expected one of \
                     native (PyTorch's caching allocator) or paged (berth's paged best fit); \
                     berth does not implement cudaMallocAsync"
                )
            );
        }
    }

    #[test]
    fn pytorch_policy_options_are_refused_with_backend_paged() {
        for (conf, key) in [
            (
                "backend:paged,expandable_segments:True",
                "expandable_segments",
            ),
            ("max_split_size_mb:64,backend:paged", "max_split_size_mb"),
            (
                "backend:paged,roundup_power2_divisions:4",
                "roundup_power2_divisions",
            ),
        ] {
            assert_eq!(
                AllocatorConfig::parse(conf),
                Err(ConfigError::NotForBackend {
                    key,
                    backend: "paged"
                }),
                "{conf}"
            );
        }
        // False is PyTorch's default: nothing is set, nothing to refuse.
        assert!(AllocatorConfig::parse("backend:paged,expandable_segments:False").is_ok());
        // Host options apply to every backend.
        assert!(AllocatorConfig::parse("backend:paged,pinned_use_cuda_host_register:True").is_ok());
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;
    use std::env::VarError;

    /// `from_vars` over a fixed set of variables.
    fn read(vars: &[(&'static str, &str)]) -> Result<AllocatorConfig, ConfigError> {
        AllocatorConfig::from_vars(|var| {
            vars.iter()
                .find(|(v, _)| *v == var)
                .map(|(_, value)| value.to_string())
                .ok_or(VarError::NotPresent)
        })
    }

    #[test]
    fn berth_then_pytorch_alloc_conf_then_pytorch_cuda_alloc_conf() {
        let berth = ("BERTH_ALLOC_CONF", "backend:paged");
        let torch = ("PYTORCH_ALLOC_CONF", "expandable_segments:True");
        let torch_cuda = ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512");
        assert_eq!(read(&[]).unwrap(), AllocatorConfig::default());
        assert_eq!(
            read(&[berth, torch, torch_cuda]).unwrap().policy(),
            Policy::Paged
        );
        assert_eq!(
            read(&[torch, torch_cuda]).unwrap().policy(),
            Policy::Expandable
        );
        let c = read(&[torch_cuda]).unwrap();
        assert_eq!(c.policy(), Policy::Pytorch);
        assert!(
            c.policy_chosen(),
            "PyTorch's options choose PyTorch's policy"
        );
        assert_eq!(c.max_split_size, Some(512 << 20));
        // An empty berth variable is set: it wins, and gives the default.
        assert_eq!(
            read(&[("BERTH_ALLOC_CONF", ""), torch]).unwrap(),
            AllocatorConfig::default()
        );
    }

    #[test]
    fn errors_name_the_variable_they_came_from() {
        for var in CONFIG_VARIABLES {
            let e = read(&[(var, "bogus:1")]).unwrap_err();
            assert!(
                matches!(&e, ConfigError::InVariable { var: v, error } if *v == var
                    && matches!(**error, ConfigError::UnknownKey { .. })),
                "{e:?}"
            );
            assert!(
                e.to_string()
                    .starts_with(&format!("{var}: unrecognized allocator config key 'bogus'")),
                "{e}"
            );
        }
    }

    #[test]
    fn pytorch_only_options_are_refused_in_berths_variable_and_skipped_in_pytorchs() {
        let e = read(&[("BERTH_ALLOC_CONF", "per_process_memory_fraction:0.5")]).unwrap_err();
        assert_eq!(
            e,
            ConfigError::InVariable {
                var: "BERTH_ALLOC_CONF",
                error: Box::new(ConfigError::NotImplemented {
                    key: "per_process_memory_fraction"
                })
            }
        );
        let conf = "max_split_size_mb:256,per_process_memory_fraction:0.5,\
                    expandable_segments_reserve_by_class:[a:0.5,b:2G],pinned_free_catch_all:True";
        let c = read(&[("PYTORCH_CUDA_ALLOC_CONF", conf)]).unwrap();
        assert_eq!(c.max_split_size, Some(256 << 20));
        assert_eq!(c.policy(), Policy::Pytorch);
        let (_, skipped) = AllocatorConfig::parse_pytorch(conf).unwrap();
        assert_eq!(
            skipped,
            [
                "per_process_memory_fraction",
                "expandable_segments_reserve_by_class",
                "pinned_free_catch_all"
            ]
        );
        let said = crate::warnings::said_for("alloc-conf-pytorch-only-keys").unwrap();
        assert!(
            said.starts_with("PYTORCH_CUDA_ALLOC_CONF: berth does not implement"),
            "{said}"
        );
        assert!(said.contains("per_process_memory_fraction"), "{said}");
        // Said once per process.
        read(&[("PYTORCH_ALLOC_CONF", "throw_on_cudamalloc_oom:True")]).unwrap();
        assert_eq!(
            crate::warnings::said()
                .iter()
                .filter(|w| w.key == "alloc-conf-pytorch-only-keys")
                .count(),
            1
        );
        // A bracketed value that never closes is still a syntax error.
        assert!(matches!(
            AllocatorConfig::parse_pytorch("expandable_segments_reserve_by_class:[a:1"),
            Err(ConfigError::Syntax { .. })
        ));
    }

    #[test]
    fn pytorchs_device_generic_and_rocm_spellings_are_the_same_keys() {
        for (alias, key) in KEY_ALIASES {
            let a = AllocatorConfig::parse(&format!("{alias}:True")).unwrap();
            let k = AllocatorConfig::parse(&format!("{key}:True")).unwrap();
            assert_eq!(
                (
                    a.release_lock_on_cudamalloc,
                    a.pinned_use_cuda_host_register
                ),
                (
                    k.release_lock_on_cudamalloc,
                    k.pinned_use_cuda_host_register
                ),
                "{alias}"
            );
            assert_ne!(
                a,
                AllocatorConfig::parse("").unwrap(),
                "{alias} set something"
            );
        }
    }
}
