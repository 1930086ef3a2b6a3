//! `pteria chat`: an interactive multi-turn conversation on stdin/stdout. Replies stream to
//! stdout; the prompt marker, notices and stats go to stderr so stdout holds only the replies.
//! Ctrl-C stops the reply in progress (at the prompt it quits); `/reset` starts over.

use super::generate::{describe_stats, on_ctrl_c, open, reply, ModelArgs, SamplingArgs};
use anyhow::Result;
use pteria::llm::{Message, StopReason};
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// A system prompt for the whole conversation.
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(a: Args) -> Result<()> {
    let opts = a.sampling.options();
    opts.sampling.validate()?;
    let (engine, info) = open(&a.model)?;
    eprintln!(
        "{}: {} tokens of context, chat format {}.\n/reset starts over, /exit or Ctrl-D quits, Ctrl-C stops a reply.",
        info.files.program.display(),
        info.context_len,
        info.template
    );

    let mut history: Vec<Message> = a.system.into_iter().map(Message::system).collect();
    let keep = history.len();
    let current = Arc::new(Mutex::new(None));
    on_ctrl_c(current.clone(), || {
        eprintln!();
        std::process::exit(130)
    });

    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next() else {
            eprintln!();
            break;
        };
        let line = line?;
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.truncate(keep);
                engine.reset()?;
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::user(text));
        match reply(&engine, history.clone(), opts.clone(), &current) {
            Ok(c) => {
                println!();
                if c.stats.stop == StopReason::Cancelled {
                    eprintln!("[stopped]");
                }
                if a.sampling.stats {
                    eprintln!("{}", describe_stats(&c));
                }
                // Forget what the model had to drop to fit, so the next prompt starts where the
                // cache does and is not re-prefilled from scratch.
                let dropped = c.stats.dropped_messages.min(history.len() - keep);
                history.drain(keep..keep + dropped);
                history.push(Message::assistant(c.text));
            }
            Err(e) => {
                println!();
                eprintln!("error: {e:#}");
                history.pop();
            }
        }
    }
    Ok(())
}
