//! `outbox --help` introduces the command as it is: its opening lines name every subcommand.

mod support;

#[test]
fn the_help_introduction_names_every_subcommand() {
    let out = support::run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let (introduction, rest) = help.split_once("Usage:").expect("a usage line");
    let commands: Vec<&str> = rest
        .split_once("Commands:")
        .expect("a commands section")
        .1
        .lines()
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(commands.len() >= 9, "{help}");
    let words: Vec<&str> = introduction
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .collect();
    let missing: Vec<&str> = commands
        .iter()
        .copied()
        .filter(|name| !words.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "the introduction does not name {missing:?}:\n{help}"
    );
}
