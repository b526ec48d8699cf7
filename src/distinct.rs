//! Whether a stream of 64-bit numbers holds any of them twice, in a few
//! bits a number. Two users: the no-op's check that no two live paths share
//! an inode the source has apart (`plan::Links`), and the update's check
//! that no two files it hardlinks from the live generation are one inode
//! (`stage::stream`). After an update every reused file has a second link
//! in the previous generation, so at 10^6 entries that is 10^6 inodes to
//! tell apart; held as plain numbers they cost more than the rest of the
//! walk.
//!
//! Numbers gather in a small buffer; a full buffer is sorted into a run,
//! stored as the gaps between its numbers in exponential-Golomb code, and
//! runs of the same size are merged as a binary counter carries, so there
//! are about log2(n / BUF) of them. Each run's code order is the one that
//! writes its gaps in the fewest bits (`best_order`). Measured by the unit
//! tests at 10^6 numbers: 1.6 bits each for clusters of consecutive inodes
//! (a directory's files made together), 4.1 bits for numbers spread over a
//! range 6 times their count; random 64-bit numbers take about 47. A
//! number seen twice is found when its copies meet in a sort or a merge.
//! A `collecting` set keeps going from there, the runs their union, and
//! names every number it was given more than once: the update that found
//! two live files joined copies exactly those apart on its second try.

/// Numbers held unsorted before they become a run (64 KiB).
const BUF: usize = 8192;

/// A set that only answers whether everything put in it was distinct, or
/// (`collecting`) which numbers it was given more than once.
#[derive(Default)]
pub struct Distinct {
    buf: Vec<u64>,
    /// Level i holds a run of about BUF << i numbers, or none.
    levels: Vec<Option<Run>>,
    twice: bool,
    /// Collecting: the numbers seen more than once so far (each may be
    /// here several times), the runs kept as the union.
    seen: Option<Vec<u64>>,
}

impl Distinct {
    /// A set that keeps going past a number seen twice, to tell which
    /// numbers were (`twice`): as small as `default` while all differ.
    pub fn collecting() -> Distinct {
        Distinct {
            seen: Some(Vec::new()),
            ..Distinct::default()
        }
    }

    pub fn insert(&mut self, n: u64) {
        if self.twice && self.seen.is_none() {
            return;
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(BUF);
        }
        self.buf.push(n);
        if self.buf.len() == BUF {
            self.flush();
        }
    }

    /// A number was already seen twice (more may be found later).
    pub fn seen_twice(&self) -> bool {
        self.twice
    }

    /// Whether no number was put in twice.
    pub fn all_distinct(self) -> bool {
        !self.finish(true).0
    }

    /// The numbers put in more than once, in order, each once: only for a
    /// `collecting` set (any other holds nothing once it found one).
    pub fn twice(self) -> Vec<u64> {
        debug_assert!(self.seen.is_some(), "not collecting");
        self.finish(false).1
    }

    /// Whether a number was put in twice, and (all of them, unless `first`
    /// stops at the first found) the ones that were, where collecting.
    fn finish(mut self, first: bool) -> (bool, Vec<u64>) {
        if !self.buf.is_empty() {
            self.flush();
        }
        let mut seen = self.seen.take().unwrap_or_default();
        if self.twice && first {
            return (true, seen);
        }
        let mut runs: Vec<Reader<'_>> = self.levels.iter().flatten().map(Run::reader).collect();
        let mut heads: Vec<Option<u64>> = runs.iter_mut().map(Reader::next).collect();
        let mut last = None;
        // Few runs (one a level): take the least head each time.
        while let Some((i, n)) = heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.map(|n| (i, n)))
            .min_by_key(|&(_, n)| n)
        {
            if last == Some(n) {
                if first {
                    return (true, seen);
                }
                seen.push(n);
            }
            last = Some(n);
            heads[i] = runs[i].next();
        }
        seen.sort_unstable();
        seen.dedup();
        (self.twice || !seen.is_empty(), seen)
    }

    fn flush(&mut self) {
        self.buf.sort_unstable();
        if self.buf.windows(2).any(|w| w[0] == w[1]) {
            let Some(seen) = self.seen.as_mut() else {
                return self.found_twice();
            };
            self.twice = true;
            seen.extend(self.buf.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]));
            self.buf.dedup();
        }
        let mut run = Run::encode(&self.buf);
        self.buf.clear();
        for slot in self.levels.iter_mut() {
            match slot.take() {
                None => {
                    *slot = Some(run);
                    return;
                }
                Some(lower) => match Run::merge(&lower, &run, self.seen.as_mut()) {
                    Some(m) => {
                        run = m;
                        // Collecting: what the merge found shared is seen.
                        self.twice |= self.seen.as_ref().is_some_and(|s| !s.is_empty());
                    }
                    None => return self.found_twice(),
                },
            }
        }
        self.levels.push(Some(run));
    }

    /// The answer is known: hold nothing more (not collecting).
    fn found_twice(&mut self) {
        self.twice = true;
        self.levels = Vec::new();
        self.buf = Vec::new();
    }
}

/// Strictly increasing numbers: the first, then each gap less one in
/// exponential-Golomb code of order `k`.
struct Run {
    len: u64,
    first: u64,
    k: u32,
    bits: Vec<u64>,
}

impl Run {
    fn encode(sorted: &[u64]) -> Run {
        let gaps = gap_lengths(&mut sorted.iter().copied());
        Run::write(sorted.len() as u64, gaps, sorted.iter().copied())
    }

    /// The union of two runs; None when they share a number, unless
    /// `seen` collects the numbers they share.
    fn merge(a: &Run, b: &Run, seen: Option<&mut Vec<u64>>) -> Option<Run> {
        let mut once = Merged::new(a, b);
        let gaps = gap_lengths(&mut once);
        let shared = once.shared;
        if shared.is_empty() {
            return Some(Run::write(a.len + b.len, gaps, Merged::new(a, b)));
        }
        let len = a.len + b.len - shared.len() as u64;
        seen?.extend_from_slice(&shared);
        Some(Run::write(len, gaps, Merged::new(a, b)))
    }

    /// The run of the `len` strictly increasing `numbers`, coded in the
    /// order that suits their `gaps` (`gap_lengths` of the same numbers).
    fn write(len: u64, gaps: Option<(u64, [u64; 65])>, numbers: impl Iterator<Item = u64>) -> Run {
        let Some((first, lengths)) = gaps else {
            return Writer::new(0, 0, 0, 0).finish();
        };
        let (k, bits) = best_order(&lengths);
        let mut w = Writer::new(len, first, k, bits);
        for n in numbers.skip(1) {
            w.push(n);
        }
        w.finish()
    }

    fn reader(&self) -> Reader<'_> {
        Reader {
            run: self,
            left: self.len,
            prev: None,
            pos: 0,
        }
    }
}

/// The numbers of two runs in order; a number in both is put in `shared`
/// and given once.
struct Merged<'a> {
    a: Reader<'a>,
    b: Reader<'a>,
    x: Option<u64>,
    y: Option<u64>,
    shared: Vec<u64>,
}

impl<'a> Merged<'a> {
    fn new(a: &'a Run, b: &'a Run) -> Merged<'a> {
        let (mut a, mut b) = (a.reader(), b.reader());
        let (x, y) = (a.next(), b.next());
        Merged {
            a,
            b,
            x,
            y,
            shared: Vec::new(),
        }
    }
}

impl Iterator for Merged<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        match (self.x, self.y) {
            (Some(p), Some(q)) if p == q => {
                self.shared.push(p);
                self.x = self.a.next();
                self.y = self.b.next();
                Some(p)
            }
            (Some(p), Some(q)) if p < q => {
                self.x = self.a.next();
                Some(p)
            }
            (_, Some(q)) => {
                self.y = self.b.next();
                Some(q)
            }
            (Some(p), None) => {
                self.x = self.a.next();
                Some(p)
            }
            (None, None) => None,
        }
    }
}

/// The first of these strictly increasing numbers, and how many of the
/// gaps after it have each bit length (`lengths[l]` gaps of l bits);
/// `None` for no numbers.
fn gap_lengths(numbers: &mut impl Iterator<Item = u64>) -> Option<(u64, [u64; 65])> {
    let first = numbers.next()?;
    let mut lengths = [0u64; 65];
    let mut prev = first;
    for n in numbers {
        lengths[(64 - (n - prev - 1).leading_zeros()) as usize] += 1;
        prev = n;
    }
    Some((first, lengths))
}

/// The order k of the exponential-Golomb code that writes gaps of these
/// bit lengths (`lengths[l]` gaps of l bits) in the fewest bits, and that
/// many bits at most. A gap of l bits costs k + 1 bits where l <= k, and
/// at most k + 2(l - k) + 1 above.
///
/// Inodes come in clusters (a directory's files made together) with jumps
/// between them: the order from the mean gap would spend the jumps' bits
/// on every small gap.
fn best_order(lengths: &[u64; 65]) -> (u32, u64) {
    let cost = |k: u32| -> u64 {
        lengths
            .iter()
            .enumerate()
            .map(|(l, &n)| {
                let l = l as u64;
                let k = u64::from(k);
                n * if l <= k { k + 1 } else { k + 2 * (l - k) + 1 }
            })
            .sum()
    };
    (0..64)
        .map(|k| (k, cost(k)))
        .min_by_key(|&(_, bits)| bits)
        .unwrap_or((0, 0))
}

/// Writes a run.
struct Writer {
    run: Run,
    prev: u64,
    word: u64,
    used: u32,
}

impl Writer {
    /// A run of `len` numbers from `first` in order `k`, taking `bits`
    /// bits at most (room for them is made at once).
    fn new(len: u64, first: u64, k: u32, bits: u64) -> Writer {
        let bits = Vec::with_capacity(1 + (bits / 64) as usize);
        Writer {
            run: Run {
                len,
                first,
                k,
                bits,
            },
            prev: first,
            word: 0,
            used: 0,
        }
    }

    fn push(&mut self, n: u64) {
        let gap = n - self.prev - 1;
        self.prev = n;
        let k = self.run.k;
        // q + 1 in Elias gamma: its bit count less one in unary, then its
        // bits below the top one; then the gap's low k bits.
        let m = (gap >> k) + 1;
        let top = 63 - m.leading_zeros();
        self.bits(u64::MAX, top);
        self.bits(0, 1);
        self.bits(m & !(1u64 << top), top);
        self.bits(gap & ((1u64 << k) - 1), k);
    }

    /// The low `n` bits of `v` (n <= 64), the lowest first.
    fn bits(&mut self, v: u64, n: u32) {
        if n == 0 {
            return;
        }
        let v = if n == 64 { v } else { v & ((1u64 << n) - 1) };
        self.word |= v << self.used;
        let room = 64 - self.used;
        if n >= room {
            self.run.bits.push(self.word);
            self.word = if room == 64 { 0 } else { v >> room };
            self.used = n - room;
        } else {
            self.used += n;
        }
    }

    fn finish(mut self) -> Run {
        if self.used > 0 {
            self.run.bits.push(self.word);
        }
        self.run.bits.shrink_to_fit();
        self.run
    }
}

struct Reader<'a> {
    run: &'a Run,
    left: u64,
    prev: Option<u64>,
    /// Bits of `bits` read so far.
    pos: u64,
}

impl Reader<'_> {
    /// The bits from `pos` on, the next one lowest (zeros past the end).
    fn peek(&self) -> u64 {
        let (i, off) = ((self.pos / 64) as usize, (self.pos % 64) as u32);
        let lo = self.run.bits.get(i).copied().unwrap_or(0) >> off;
        let hi = match off {
            0 => 0,
            _ => self.run.bits.get(i + 1).copied().unwrap_or(0) << (64 - off),
        };
        lo | hi
    }

    /// The next `n` bits (n < 64).
    fn bits(&mut self, n: u32) -> u64 {
        let v = self.peek() & ((1u64 << n) - 1);
        self.pos += u64::from(n);
        v
    }

    /// The number of one bits before the next zero, and that zero.
    fn unary(&mut self) -> u32 {
        let ones = self.peek().trailing_ones();
        // A gap's count is below 64, so its ones and the zero fit one peek.
        self.pos += u64::from(ones) + 1;
        ones
    }
}

impl Iterator for Reader<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let Some(prev) = self.prev else {
            self.prev = Some(self.run.first);
            return self.prev;
        };
        let top = self.unary();
        let m = (1u64 << top) | self.bits(top);
        let k = self.run.k;
        let gap = ((m - 1) << k) | self.bits(k);
        let n = prev + gap + 1;
        self.prev = Some(n);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The next number of a linear congruential sequence.
    fn step(x: &mut u64) -> u64 {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *x
    }

    fn distinct(ns: &[u64]) -> bool {
        let mut d = Distinct::default();
        ns.iter().for_each(|&n| d.insert(n));
        d.all_distinct()
    }

    /// Numbers a run decodes to, to check the code itself.
    fn round_trip(sorted: &[u64]) -> Vec<u64> {
        Run::encode(sorted).reader().collect()
    }

    #[test]
    fn runs_decode_to_what_they_encode_at_every_gap_size() {
        let cases: Vec<Vec<u64>> = vec![
            vec![],
            vec![0],
            vec![u64::MAX],
            vec![0, u64::MAX],
            vec![0, 1, 2, 3, u64::MAX - 1, u64::MAX],
            (0..1000).collect(),
            (0..1000).map(|i| i * 977 + (i % 7)).collect(),
            (0..64).map(|i| 1u64 << i).collect(),
        ];
        for c in cases {
            assert_eq!(round_trip(&c), c);
        }
    }

    #[test]
    fn dense_inodes_cost_a_few_bits_each() {
        // 10^6 numbers in a range of 6 * 10^6, as a local filesystem's
        // inode numbers of one tree.
        let mut d = Distinct::default();
        let mut x = 12345u64;
        for i in 0..1_000_000u64 {
            d.insert(i * 6 + (step(&mut x) >> 62)); // each in its own stride of 6
        }
        let bytes: usize = d.levels.iter().flatten().map(|r| r.bits.len() * 8).sum();
        assert!(bytes < 1_000_000, "{bytes} bytes");
        assert!(d.all_distinct());
    }

    #[test]
    fn clustered_inodes_cost_about_a_bit_or_two_each() {
        // A directory's files made together: runs of 100 near-consecutive
        // numbers, the runs far apart (as after a parallel copy).
        let mut d = Distinct::default();
        let mut x = 99u64;
        for cluster in 0..10_000u64 {
            let base = (cluster << 32) | ((step(&mut x) >> 40) << 8);
            for i in 0..100 {
                d.insert(base + i);
            }
        }
        let bytes: usize = d.levels.iter().flatten().map(|r| r.bits.len() * 8).sum();
        assert!(bytes < 300_000, "{bytes} bytes for 10^6 numbers");
        assert!(d.all_distinct());
    }

    #[test]
    fn a_number_twice_is_found_in_one_buffer_across_runs_and_at_the_end() {
        assert!(distinct(&[1, 2, 3]));
        assert!(!distinct(&[1, 2, 1]));
        // Across two full buffers (merged into one level).
        let mut ns: Vec<u64> = (0..2 * BUF as u64).collect();
        assert!(distinct(&ns));
        ns.push(5);
        assert!(!distinct(&ns));
        // One copy in a run, the other in the final partial buffer.
        let mut ns: Vec<u64> = (0..BUF as u64 + 10).map(|i| i * 3).collect();
        ns.push(3 * 7);
        assert!(!distinct(&ns));
        // Copies in runs of different levels, met only at the end.
        let mut ns: Vec<u64> = (0..3 * BUF as u64).map(|i| i * 2).collect();
        ns.push(0);
        ns.extend((0..BUF as u64 - 1).map(|i| i * 2 + 1 + 10_000_000));
        assert!(!distinct(&ns));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn agrees_with_a_plain_set(
            len in 0usize..30_000,
            spread in prop_oneof![Just(1u64 << 16), Just(1u64 << 24), Just(u64::MAX)],
            dup in prop::option::of(any::<prop::sample::Index>()),
            seed in any::<u64>(),
        ) {
            // Distinct numbers in any order, from the seed; then maybe one again.
            let mut x = seed;
            let mut seen = std::collections::HashSet::new();
            let mut ns: Vec<u64> = (0..len)
                .map(|_| step(&mut x) % spread)
                .filter(|n| seen.insert(*n))
                .collect();
            let twice = match dup {
                Some(i) if !ns.is_empty() => {
                    let again = ns[i.index(ns.len())];
                    let at = (step(&mut x) >> 33) as usize % (ns.len() + 1);
                    ns.insert(at, again);
                    true
                }
                _ => false,
            };
            prop_assert_eq!(distinct(&ns), !twice);
        }

        /// A collecting set names exactly the numbers given more than
        /// once, however many and wherever the copies fall.
        #[test]
        fn collecting_names_every_number_given_twice(
            len in 0usize..30_000,
            spread in prop_oneof![Just(1u64 << 12), Just(1u64 << 16), Just(u64::MAX)],
            seed in any::<u64>(),
        ) {
            let mut x = seed;
            let ns: Vec<u64> = (0..len).map(|_| step(&mut x) % spread).collect();
            let mut counts = std::collections::HashMap::new();
            ns.iter().for_each(|&n| *counts.entry(n).or_insert(0u32) += 1);
            let mut want: Vec<u64> = counts.into_iter().filter(|&(_, c)| c > 1).map(|(n, _)| n).collect();
            want.sort_unstable();
            let mut d = Distinct::collecting();
            ns.iter().for_each(|&n| d.insert(n));
            // What it says early it never takes back, and never says
            // of numbers all different.
            prop_assert!(!d.seen_twice() || !want.is_empty());
            prop_assert_eq!(d.twice(), want);
        }
    }
}
