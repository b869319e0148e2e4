//! Says whether the io_uring back end can run here, and if not, why.
//!
//! Exit status: 0 usable, 2 not usable (the reason is printed). The test
//! suite uses it to decide whether to run the io_uring pass.

fn main() {
    match ferry_engine::uring::probe() {
        Ok(()) => println!("io_uring: usable"),
        Err(why) => {
            println!("io_uring: not usable: {why}");
            std::process::exit(2);
        }
    }
}
