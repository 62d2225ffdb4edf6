//! Prints what this build of pn-kernels embeds: the one-line summary and the `ptxas -v` table
//! (registers, spills, stack, shared memory per kernel for sm_60). CI runs it after the build.

fn main() {
    println!("{}", pn_kernels::build_info());
    print!("{}", pn_kernels::ptxas_report());
    let spills = pn_kernels::ptxas_report()
        .lines()
        .skip(2)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 5 && (f[3] != "0" || f[4] != "0")
        })
        .count();
    println!("kernels that spill on sm_60: {spills}");
}
