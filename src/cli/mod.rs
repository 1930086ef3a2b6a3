//! Subcommands of the `pteria` binary; each file translates arguments and calls the library.

pub mod bench;
pub mod chat;
pub mod generate;
pub mod inspect;
pub mod logits;
pub mod models;
