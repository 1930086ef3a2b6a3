//! The user's chat settings, persisted as `<data dir>/settings.json`: sampling, reply length,
//! system prompt, Gemma 4 thinking, the device models load on and where their big embedding
//! tables live, and the last model loaded.

use super::store::write_atomic;
use super::{ChatError, Result};
use crate::llm::{GenerateOptions, SamplingParams};
use crate::runtime::delegate::{Device, Tables};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Where delegate graphs run, as the settings store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The GPU when a real one opens, else the CPU.
    #[default]
    Auto,
    Gpu,
    Cpu,
}

impl DeviceChoice {
    pub fn device(self) -> Device {
        match self {
            DeviceChoice::Auto => Device::Auto,
            DeviceChoice::Gpu => Device::Gpu,
            DeviceChoice::Cpu => Device::Cpu,
        }
    }
}

/// Where a model's big embedding tables live, as the settings store it (`Tables`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TablesChoice {
    /// GPU memory on a discrete GPU with room for them, else host memory.
    #[default]
    Auto,
    /// Host memory, gathered a row a token: the OS can reclaim their file pages, and GPU memory
    /// stays free for other work.
    Host,
    /// GPU memory (decode steps then run one ahead); needs the GPU device.
    Gpu,
}

impl TablesChoice {
    pub fn tables(self) -> Tables {
        match self {
            TablesChoice::Auto => Tables::Auto,
            TablesChoice::Host => Tables::Host,
            TablesChoice::Gpu => Tables::Gpu,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Sent as the system turn of every conversation; empty sends none.
    pub system_prompt: String,
    /// 0 is greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// 0 turns it off.
    pub top_k: usize,
    /// 0 turns it off.
    pub min_p: f32,
    /// Longest reply in tokens; `None` until the model ends its turn or the context is full.
    pub max_tokens: Option<usize>,
    /// Gemma 4 thinking mode.
    pub thinking: bool,
    pub device: DeviceChoice,
    pub tables: TablesChoice,
    /// `model:variant` loaded last, to load again on start.
    pub model: Option<String>,
}

impl Default for Settings {
    /// Gemma 4's generation config (temperature 1, top-k 64, top-p 0.95), a 1024-token reply cap.
    fn default() -> Self {
        let s = SamplingParams::default();
        Settings {
            system_prompt: String::new(),
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            min_p: s.min_p,
            max_tokens: Some(1024),
            thinking: false,
            device: DeviceChoice::Auto,
            tables: TablesChoice::Auto,
            model: None,
        }
    }
}

impl Settings {
    /// The generation options these settings ask for.
    pub fn generate_options(&self) -> GenerateOptions {
        GenerateOptions {
            sampling: SamplingParams {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                min_p: self.min_p,
                ..SamplingParams::default()
            },
            max_new_tokens: self.max_tokens,
            enable_thinking: self.thinking,
        }
    }

    /// Checks every value, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.generate_options()
            .sampling
            .validate()
            .map_err(|e| ChatError::Settings(e.to_string()))?;
        if self.max_tokens == Some(0) {
            return Err(ChatError::Settings(
                "max tokens must be at least 1 (or unset for no limit)".into(),
            ));
        }
        if (self.device, self.tables) == (DeviceChoice::Cpu, TablesChoice::Gpu) {
            return Err(ChatError::Settings(
                "embedding tables in GPU memory need the GPU: the device is the CPU".into(),
            ));
        }
        Ok(())
    }

    /// The saved settings, or `None` when there are none. A damaged file (one that does not
    /// parse, or holds a value `validate` refuses) is `ChatError::Corrupt` (the caller shows it
    /// and may start over with `Settings::default()`), never silently lost; any other read error
    /// is `ChatError::Io`.
    pub fn load(path: &Path) -> Result<Option<Settings>> {
        let corrupt = |reason: String| ChatError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        match std::fs::read(path) {
            Ok(bytes) => {
                let s: Settings =
                    serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
                // A value the settings page would refuse breaks every reply (a zero-token cap, a
                // negative temperature): such a file is as damaged as one that does not parse.
                s.validate().map_err(|e| match e {
                    ChatError::Settings(reason) => corrupt(reason),
                    other => corrupt(other.to_string()),
                })?;
                Ok(Some(s))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ChatError::Io {
                action: "reading",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| ChatError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        write_atomic(path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_missing_fields_take_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        assert_eq!(Settings::load(&path).unwrap(), None);
        let s = Settings {
            system_prompt: "Be brief.".into(),
            temperature: 0.0,
            top_k: 5,
            thinking: true,
            device: DeviceChoice::Cpu,
            tables: TablesChoice::Host,
            model: Some("m:v".into()),
            ..Settings::default()
        };
        s.save(&path).unwrap();
        assert_eq!(Settings::load(&path).unwrap(), Some(s));
        std::fs::write(&path, br#"{"temperature": 0.5}"#).unwrap();
        let partial = Settings::load(&path).unwrap().unwrap();
        assert_eq!(partial.temperature, 0.5);
        assert_eq!(partial.top_k, Settings::default().top_k);
    }

    #[test]
    fn a_damaged_settings_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        std::fs::write(&path, b"{ temperature").unwrap();
        let e = Settings::load(&path).unwrap_err();
        assert!(e.to_string().contains("settings.json"), "{e}");
    }

    #[test]
    fn a_settings_file_with_a_value_out_of_range_is_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        for (json, named) in [
            (r#"{"max_tokens": 0}"#, "max tokens"),
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"device": "cpu", "tables": "gpu"}"#, "tables"),
        ] {
            std::fs::write(&path, json).unwrap();
            let e = Settings::load(&path).unwrap_err();
            assert!(matches!(e, ChatError::Corrupt { .. }), "{json}: {e}");
            let e = e.to_string();
            assert!(e.contains("settings.json") && e.contains(named), "{e}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_their_name() {
        let bad = Settings {
            temperature: -1.0,
            ..Settings::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("temperature"), "{e}");
        let bad = Settings {
            top_p: 1.5,
            ..Settings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top"));
        let bad = Settings {
            max_tokens: Some(0),
            ..Settings::default()
        };
        assert!(bad.validate().is_err());
        assert!(Settings::default().validate().is_ok());
        // Tables in GPU memory on the CPU device: refused, as `--tables gpu --device cpu` is.
        let bad = Settings {
            device: DeviceChoice::Cpu,
            tables: TablesChoice::Gpu,
            ..Settings::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("tables") && e.contains("CPU"), "{e}");
        for (device, tables) in [
            (DeviceChoice::Cpu, TablesChoice::Host),
            (DeviceChoice::Cpu, TablesChoice::Auto),
            (DeviceChoice::Gpu, TablesChoice::Gpu),
            (DeviceChoice::Auto, TablesChoice::Gpu),
        ] {
            let ok = Settings {
                device,
                tables,
                ..Settings::default()
            };
            assert!(ok.validate().is_ok(), "{device:?} {tables:?}");
        }
    }

    #[test]
    fn settings_become_generation_options() {
        let s = Settings {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            min_p: 0.05,
            max_tokens: None,
            thinking: true,
            ..Settings::default()
        };
        let o = s.generate_options();
        assert_eq!(
            (
                o.sampling.temperature,
                o.sampling.top_p,
                o.sampling.top_k,
                o.sampling.min_p
            ),
            (0.7, 0.9, 40, 0.05)
        );
        assert_eq!((o.max_new_tokens, o.enable_thinking), (None, true));
    }
}
