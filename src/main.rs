//! Run packsync and exit with its status. Nothing else.

fn main() {
    std::process::exit(packsync::main());
}
