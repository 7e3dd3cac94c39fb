//! One way to print sizes across commands: binary units (KiB, MiB, GiB), as `ls -h` and
//! llama.cpp print file and buffer sizes. (Rates of memory traffic stay in decimal GB/s, the
//! unit bandwidth figures are quoted in.)

/// `n` bytes as "634.5 MiB", "1.17 GiB", "812 B".
pub fn bytes(n: u64) -> String {
    match n {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn binary_units() {
        assert_eq!(super::bytes(812), "812 B");
        assert_eq!(super::bytes(2048), "2.0 KiB");
        assert_eq!(super::bytes(634 << 20), "634.0 MiB");
        assert_eq!(super::bytes(3 << 29), "1.50 GiB");
    }
}
