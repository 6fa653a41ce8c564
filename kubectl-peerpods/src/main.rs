//! `kubectl peerpods`: kubectl finds this binary on PATH by its name and passes the arguments through.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kubectl_peerpods::release::{self, Step};
use kubectl_peerpods::{Error, gather, parse_reference, render};
use peerpods_api::peerpod::ReleaseAsk;

/// Peer pods cleanup at a glance: stuck deletes, orphan VMs, capacity. Read-only, but for `release`.
#[derive(Parser)]
#[command(name = "kubectl-peerpods", version)]
struct Cli {
    /// Colour: auto (only when stdout is a terminal and NO_COLOR is unset), always or never.
    #[arg(long, default_value = "auto", global = true)]
    colour: Colour,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Colour {
    Auto,
    Always,
    Never,
}

#[derive(Subcommand)]
enum Command {
    /// Per provider: live, terminating, deleting, stuck and reverse-orphan PeerPods, orphan VMs, and the
    /// kata.peerpods.io/vm capacity of each node.
    Status,
    /// One PeerPod's cleanup: its conditions (what provider-service answered) and its Events.
    Describe {
        /// <namespace>/<peerpod>
        peerpod: String,
    },
    /// The VMs peerpod-ctrl's orphan scan reported (orphan or adoptable) that no PeerPod refers to.
    Orphans,
    /// Release one PeerPod being deleted without a delete: sets its peerpods.io/release annotation
    /// (instance-gone: released once provider-service confirms the VM gone; --operator: released at once, the VM
    /// is yours). Asks first.
    Release {
        /// <namespace>/<peerpod>
        peerpod: String,
        /// Release at once without deleting the VM: you answer for it.
        #[arg(long)]
        operator: bool,
        /// Do not ask (needed without a terminal).
        #[arg(long)]
        yes: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<String, Error> {
    let style = render::Style {
        colour: match cli.colour {
            // NO_COLOR (no-color.org) is what other terminal tools honour too.
            Colour::Auto => {
                std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
            }
            Colour::Always => true,
            Colour::Never => false,
        },
    };
    let client = kube::Client::try_default().await.map_err(Error::Connect)?;
    let now = jiff::Timestamp::now();
    Ok(match cli.command {
        Command::Status => render::status(&gather::cluster(&client).await?, now, style),
        Command::Orphans => render::orphans(&gather::cluster(&client).await?, now, style),
        Command::Describe { peerpod } => {
            let (namespace, name) = parse_reference(&peerpod)?;
            let (pp, events) = gather::peerpod_story(&client, namespace, name).await?;
            render::describe(&pp, &events, now, style)
        }
        Command::Release {
            peerpod,
            operator,
            yes,
        } => {
            let (namespace, name) = parse_reference(&peerpod)?;
            let ask = if operator {
                ReleaseAsk::Operator
            } else {
                ReleaseAsk::InstanceGone
            };
            let target = release::read(&client, namespace, name).await?;
            // The answer is read from stdin, so that is what must be a terminal.
            let terminal = std::io::stdin().is_terminal();
            if let Step::Confirm(question) = release::decide(&target, &ask, yes, terminal)?
                && !release::confirmed(&ask_on_terminal(&question)?)
            {
                return Err(Error::NotConfirmed);
            }
            release::set(&client, &target, &ask).await?;
            release::done(&target, &ask)
        }
    })
}

/// Asks on stderr (stdout is the command's output) and reads one line of answer.
fn ask_on_terminal(question: &str) -> Result<String, Error> {
    let mut stderr = std::io::stderr();
    stderr
        .write_all(question.as_bytes())
        .and_then(|()| stderr.flush())
        .map_err(Error::Terminal)?;
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(Error::Terminal)?;
    Ok(answer)
}
