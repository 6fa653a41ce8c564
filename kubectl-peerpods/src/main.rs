//! `kubectl peerpods`: kubectl finds this binary on PATH by its name and passes the arguments through.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kubectl_peerpods::{Error, gather, parse_reference, render};

/// Peer pods cleanup at a glance: stuck deletes, orphan VMs, capacity. Read-only.
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
    })
}
