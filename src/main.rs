//! The `pteria` command line: inspect programs, run them, and manage models.

use clap::{Parser, Subcommand};

mod cli;

#[derive(Parser)]
#[command(
    name = "pteria",
    version,
    about = "On-device Gemma 4 chat engine for ExecuTorch programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a .pte program: methods, shapes, metadata, delegates, segments.
    Inspect(cli::inspect::Args),
    /// Run `forward` on a prompt then decode tokens; print every call's output as JSON.
    Logits(cli::logits::Args),
    /// The model catalog, downloads and the local cache.
    Models(cli::models::Args),
    /// Chat with a model interactively (streamed; Ctrl-C stops a reply).
    Chat(cli::chat::Args),
    /// Answer one prompt (wrapped in the model's chat template) and print only the reply.
    Generate(cli::generate::Args),
    /// Benchmark a program (prefill, decode, memory, per-op GPU time) or, with --kernels, the
    /// decode mat-vec kernels against the device's streaming bandwidth.
    Bench(cli::bench::Args),
}

fn main() {
    pteria::runtime::tune_allocator();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => cli::inspect::run(a),
        Command::Logits(a) => cli::logits::run(a),
        Command::Models(a) => cli::models::run(a),
        Command::Chat(a) => cli::chat::run(a),
        Command::Generate(a) => cli::generate::run(a),
        Command::Bench(a) => cli::bench::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
