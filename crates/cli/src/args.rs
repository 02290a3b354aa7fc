//! Parsing the command line: a value that starts with `-` is a value where a number is taken
//! (`--budget-gb -1`, `--lambda -0.5`, `--k -1,2`), so that the option's own range check names it,
//! instead of clap reading it as an unknown flag. Also the range checks of numeric options.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Command, CommandFactory, FromArgMatches};

use crate::commands::Cli;

/// The parsed command line; on a parse error (or `--help`, `--version`) prints and exits as clap does.
pub fn parse() -> Cli {
    let mut cmd = numbers_are_values(Cli::command());
    let matches = cmd.try_get_matches_from_mut(std::env::args_os()).unwrap_or_else(|e| explain(e, &mut cmd).exit());
    if let Err(e) = check_output(&cmd, &matches) {
        e.format(&mut cmd).exit();
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}

/// Refuses, before any work, an output (`-o PATH`) that cannot be written because a directory on
/// its way is a file, naming the option, the path and the file. (Missing directories are created
/// when the output is written.)
fn check_output(cmd: &Command, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
    let (mut cmd, mut matches) = (cmd, matches);
    while let Some((name, sub)) = matches.subcommand() {
        let Some(c) = cmd.find_subcommand(name) else { break };
        (cmd, matches) = (c, sub);
    }
    let Some(arg) = cmd.get_arguments().find(|a| a.get_id() == "output") else { return Ok(()) };
    let Ok(Some(raw)) = matches.try_get_raw("output") else { return Ok(()) };
    for value in raw {
        let path = std::path::Path::new(value);
        if value == "-" {
            continue;
        }
        // The nearest ancestor that exists must be a directory.
        let blocking = path.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()).find(|a| a.exists());
        if let Some(file) = blocking.filter(|a| !a.is_dir()) {
            let flag = match (arg.get_short(), arg.get_long()) {
                (Some(s), Some(l)) => format!("-{s}/--{l}"),
                (None, Some(l)) => format!("--{l}"),
                _ => "-o".into(),
            };
            return Err(clap::Error::raw(
                ErrorKind::ValueValidation,
                format!(
                    "{flag} {}: {} is a file, not a directory, so the output cannot be written there: choose \
                     another output path\n",
                    path.display(),
                    file.display()
                ),
            ));
        }
    }
    Ok(())
}

/// `cmd` and its subcommands with every option that takes a value accepting a negative number as
/// that value (a comma-separated list accepting any leading `-`, since `-1,2` is not a number).
fn numbers_are_values(cmd: Command) -> Command {
    cmd.mut_args(|a| {
        if !a.get_action().takes_values() {
            a
        } else if a.get_value_delimiter().is_some() {
            a.allow_hyphen_values(true)
        } else {
            a.allow_negative_numbers(true)
        }
    })
    .mut_subcommands(numbers_are_values)
}

/// clap's error, with a negative number given to a whole-number option said in words: clap
/// reports the integer parser's "invalid digit found in string".
fn explain(e: clap::Error, cmd: &mut Command) -> clap::Error {
    let negative_int = e.kind() == ErrorKind::ValueValidation
        && std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::num::ParseIntError>())
            .is_some_and(|p| *p.kind() == std::num::IntErrorKind::InvalidDigit);
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) =
        (e.get(ContextKind::InvalidArg), e.get(ContextKind::InvalidValue))
    else {
        return e;
    };
    let negative =
        value.strip_prefix('-').is_some_and(|v| v.split(',').next().is_some_and(|n| n.parse::<f64>().is_ok()));
    if !negative_int || !negative {
        return e;
    }
    let flag = arg.split_whitespace().next().unwrap_or(arg);
    let msg = format!("invalid value '{value}' for '{arg}': {flag} takes whole numbers >= 0, not a negative number\n");
    clap::Error::raw(ErrorKind::ValueValidation, msg).format(cmd)
}

/// A policy name, for `value_parser`: the names come from cachesim's policy table
/// (`Policy::ALL`), so `--help` lists them, shell completions offer them, and clap refuses any
/// other with the list.
pub fn policy() -> impl clap::builder::TypedValueParser<Value = cachesim::Policy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(cachesim::Policy::ALL.map(cachesim::Policy::as_str))
        .try_map(|name| name.parse::<cachesim::Policy>())
}

/// The help of `--tier2`, with the policies that may serve there from their facts
/// (`cachesim::deploy::Tier2::allowed_policies`).
pub fn tier2_help() -> String {
    format!(
        "A second memory tier under the cache, POLICY:CAP ({}; CAP >= k_used), e.g. `lru:32` (SEMANTICS.md §10)",
        cachesim::deploy::Tier2::allowed_policies()
    )
}

/// The help of `mrc --policy`: which policies take one pass over every cap, from their facts.
pub fn mrc_policy_help() -> String {
    use cachesim::Policy;
    use cachesim::Semantics::{KWay, Sequential};
    use cachesim::mrc::has_one_pass;
    let names = |f: fn(Policy) -> bool| {
        Policy::ALL.into_iter().filter(|&p| f(p)).map(Policy::as_str).collect::<Vec<_>>().join(", ")
    };
    let both = names(|p| has_one_pass(p, KWay) && has_one_pass(p, Sequential));
    let kway = names(|p| has_one_pass(p, KWay) && !has_one_pass(p, Sequential));
    let none = names(|p| !has_one_pass(p, KWay));
    format!(
        "Cache policy; one pass over every cap for {both} (both semantics) and {kway} (k-way), one replay per cap \
         for {none}"
    )
}

/// A whole number >= 1 (a batch, k_used, K), for `value_parser`: `-1` and `0` are refused by
/// the same rule, in the same words.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s} is not a whole number >= 1")),
    }
}

/// A finite number > 0 (a bandwidth, a size, a time), for `value_parser`.
pub fn positive(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x > 0.0 { Ok(x) } else { Err(format!("{s} is not > 0")) }
}

/// A finite number >= 0, for `value_parser`.
pub fn non_negative(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x >= 0.0 { Ok(x) } else { Err(format!("{s} is negative: give a number >= 0")) }
}

/// A fraction in [0, 1], for `value_parser`.
pub fn fraction(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if (0.0..=1.0).contains(&x) { Ok(x) } else { Err(format!("{s} is not in [0, 1]")) }
}

/// A finite number.
fn number(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        Ok(_) => Err(format!("{s} is not a finite number")),
        Err(_) => Err(format!("{s} is not a number")),
    }
}

/// How the command line spells an option that a message of the command layer names
/// (`api::Spell`): `k_used` → `--k-used`, `prefetch=coact:B` → `--prefetch coact:B`.
pub struct Flags;

impl api::Spell for Flags {
    fn option(&self, name: &str) -> String {
        format!("--{}", name.replace('_', "-"))
    }

    fn with_value(&self, name: &str, value: &str) -> String {
        format!("{} {value}", self.option(name))
    }
}

/// A result of the command layer with its error spelled in flags.
pub trait Spelled<T> {
    /// The error as the command line says it.
    ///
    /// # Errors
    /// The command layer's error, its options spelled as flags.
    fn flags(self) -> anyhow::Result<T>;
}

impl<T> Spelled<T> for api::Result<T> {
    fn flags(self) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::anyhow!(e.render(&Flags)))
    }
}

/// A list of model blocks, `1-26` or `0,8,12-18` (`--moe-layers`): one value for clap, read by
/// [`sweep::plan::llama::parse_blocks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocks(pub Vec<u32>);

impl std::str::FromStr for Blocks {
    type Err = String;
    fn from_str(s: &str) -> Result<Blocks, String> {
        sweep::plan::llama::parse_blocks(s).map(Blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_parsers() {
        // (input, positive, non_negative, fraction); None = refused
        type Case<'a> = (&'a str, Option<f64>, Option<f64>, Option<f64>);
        let cases: [Case<'_>; 7] = [
            ("1.5", Some(1.5), Some(1.5), None),
            ("0", None, Some(0.0), Some(0.0)),
            ("0.25", Some(0.25), Some(0.25), Some(0.25)),
            ("1", Some(1.0), Some(1.0), Some(1.0)),
            ("-1", None, None, None),
            ("inf", None, None, None),
            ("x", None, None, None),
        ];
        for (s, p, n, f) in cases {
            assert_eq!(positive(s).ok(), p, "positive {s}");
            assert_eq!(non_negative(s).ok(), n, "non_negative {s}");
            assert_eq!(fraction(s).ok(), f, "fraction {s}");
        }
        assert_eq!(non_negative("-2").unwrap_err(), "-2 is negative: give a number >= 0");
    }

    #[test]
    fn negative_numbers_reach_the_option_s_check() {
        let parse = |args: &[&str]| numbers_are_values(Cli::command()).try_get_matches_from(args).map(|_| ());
        // Taken as a value (then checked by the option), not as an unknown flag.
        for args in [
            &["moe-offload", "keep", "s.json", "--k", "-1,2", "-o", "k.json"][..],
            &["moe-offload", "replay", "t", "--policy", "lru", "--cap", "-3"][..],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{args:?}: {e}");
        }
        // A flag after a list option is still a flag.
        assert!(parse(&["moe-offload", "replay", "t", "--policy", "lru", "--cap", "2", "--json"]).is_ok());
    }
}
