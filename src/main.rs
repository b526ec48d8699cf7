//! Parse the command line, run, map the outcome to an exit status. Nothing else.

fn main() {
    let cfg = match packsync::cli::parse() {
        Ok(cfg) => cfg,
        Err(e) => e.exit(),
    };
    let code = match packsync::app::run(cfg) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("packsync: error: {err:#}");
            packsync::error::exit_code(&err)
        }
    };
    std::process::exit(code);
}
