//! Parse the command line, run, map the outcome to an exit status. Nothing else.

fn main() {
    let cfg = match packsync::cli::parse() {
        Ok(cfg) => cfg,
        Err(e) => e.exit(),
    };
    let json = cfg.json();
    let code = match packsync::app::run(cfg) {
        Ok(code) => code,
        Err(err) => packsync::report::error(&err, json),
    };
    std::process::exit(code);
}
