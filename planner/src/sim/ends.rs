//! The next stream end of each resource's held groups, earliest first.

/// A binary heap that holds at most one entry per resource and moves it
/// when the resource's level or its held groups change. (A heap of events
/// with stale entries left behind grew to millions of entries where
/// hundreds of groups share a link.)
pub(super) struct Ends {
    heap: Vec<(f64, usize)>,
    /// Where each resource sits in `heap`, or `ABSENT`.
    at: Vec<usize>,
}

const ABSENT: usize = usize::MAX;

impl Ends {
    pub(super) fn new(n: usize) -> Ends {
        Ends {
            heap: Vec::new(),
            at: vec![ABSENT; n],
        }
    }

    /// The earliest end: its time and resource (ties by resource).
    pub(super) fn peek(&self) -> Option<(f64, usize)> {
        self.heap.first().copied()
    }

    fn less(a: (f64, usize), b: (f64, usize)) -> bool {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).is_lt()
    }

    /// Set (or move) a resource's next end.
    pub(super) fn set(&mut self, r: usize, t: f64) {
        let i = match self.at[r] {
            ABSENT => {
                self.heap.push((t, r));
                self.heap.len() - 1
            }
            i => {
                self.heap[i].0 = t;
                i
            }
        };
        self.at[r] = i;
        let i = self.up(i);
        self.down(i);
    }

    /// Forget a resource's next end, if it has one.
    pub(super) fn remove(&mut self, r: usize) {
        let i = self.at[r];
        if i == ABSENT {
            return;
        }
        self.at[r] = ABSENT;
        let last = self.heap.pop().expect("a listed resource is in the heap");
        if i < self.heap.len() {
            self.heap[i] = last;
            self.at[last.1] = i;
            let i = self.up(i);
            self.down(i);
        }
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.at[self.heap[i].1] = i;
        self.at[self.heap[j].1] = j;
    }

    fn up(&mut self, mut i: usize) -> usize {
        while i > 0 {
            let parent = (i - 1) / 2;
            if !Ends::less(self.heap[i], self.heap[parent]) {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
        i
    }

    fn down(&mut self, mut i: usize) -> usize {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < self.heap.len() && Ends::less(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < self.heap.len() && Ends::less(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                return i;
            }
            self.swap(i, m);
            i = m;
        }
    }
}
