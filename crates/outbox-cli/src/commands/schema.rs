//! `outbox schema check`: is the next version of an event type backward compatible with the
//! previous one (the additive-only rule of `outbox::compat`)? For CI: exit code 0 when
//! compatible, 1 when not (every problem printed, one a line, with its JSON path), 2 when an
//! input cannot be read or compared (not JSON, a keyword the check does not judge, a document
//! that could be a schema or an example).

use std::{path::PathBuf, process::ExitCode};

use outbox::compat::{self, Format};

use super::{print, CommandResult};

/// `outbox schema …`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Check that NEXT only adds optional fields to PREVIOUS (JSON Schemas or example
    /// payloads). Exit 0 compatible, 1 incompatible, 2 bad input.
    Check(CheckArgs),
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    /// The previous version: a JSON Schema or an example payload (JSON file).
    #[arg(long)]
    previous: PathBuf,
    /// The next version, in the same forms.
    #[arg(long)]
    next: PathBuf,
    /// How to read both files: `auto` (a schema when it declares `$schema` or every key at
    /// its root is a JSON Schema keyword, one of them telling; an example when none is; a
    /// document that could be either is refused with exit 2), `schema` or `example`.
    #[arg(long, value_enum, default_value = "auto")]
    format: FormatArg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum FormatArg {
    Auto,
    Schema,
    Example,
}

/// Runs the subcommand.
pub async fn run(args: Args) -> CommandResult {
    let Command::Check(args) = args.command;
    let format = match args.format {
        FormatArg::Auto => Format::Auto,
        FormatArg::Schema => Format::Schema,
        FormatArg::Example => Format::Example,
    };
    let previous = read(&args.previous)?;
    let next = read(&args.next)?;
    let report = compat::check_as(&previous, &next, format)?;
    if report.is_compatible() {
        print(&format!(
            "compatible: {} only adds optional fields to {}\n",
            args.next.display(),
            args.previous.display()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    print(&format!(
        "incompatible: {} breaks consumers of {} ({} problem{}):\n{report}\n",
        args.next.display(),
        args.previous.display(),
        report.problems.len(),
        if report.problems.len() == 1 { "" } else { "s" }
    ));
    Ok(ExitCode::from(1))
}

fn read(path: &PathBuf) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))
}
