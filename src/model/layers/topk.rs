//! `torch.topk(x, k, largest=True, sorted=True)` on the CPU, equal values included: PyTorch's
//! kernel (aten/src/ATen/native/cpu/SortingKernel.cpp, `topk_impl_loop`) fills (value, index)
//! pairs and runs libstdc++'s `std::partial_sort` when `k * 64 <= n`, else `std::nth_element`
//! then `std::sort` of the first `k - 1`. Neither is stable, so which of several equal values
//! comes first is whatever those algorithms leave (`topk([0, 2, 1, 2, 2], 2)` gives indices
//! 1 and 4, not 1 and 3). No crate reproduces libstdc++'s element order, so the three
//! algorithms are written out here, step for step as libstdc++ (GCC 13, bits/stl_algo.h and
//! bits/stl_heap.h) has them, with `comp(x, y) = x > y` (NaN above every number, as PyTorch's).

type Elem = (f32, usize);

fn comp(x: &Elem, y: &Elem) -> bool {
    (x.0.is_nan() && !y.0.is_nan()) || x.0 > y.0
}

/// The indices of the `k` largest of `values` in the order torch.topk returns them.
pub fn topk(values: &[f32], k: usize) -> Vec<usize> {
    let n = values.len();
    let k = k.min(n);
    if k == 0 {
        return Vec::new();
    }
    let mut q: Vec<Elem> = values.iter().copied().zip(0..).collect();
    if k * 64 <= n {
        partial_sort(&mut q, k);
    } else {
        nth_element(&mut q, k - 1);
        sort(&mut q[..k - 1]);
    }
    q[..k].iter().map(|e| e.1).collect()
}

fn lg(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

fn nth_element(q: &mut [Elem], nth: usize) {
    let (mut first, mut last) = (0usize, q.len());
    let mut depth = 2 * lg(q.len());
    while last - first > 3 {
        if depth == 0 {
            heap_select(&mut q[first..last], nth - first + 1);
            q.swap(first, nth);
            return;
        }
        depth -= 1;
        let cut = first + partition_pivot(&mut q[first..last]);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(&mut q[first..last]);
}

fn sort(q: &mut [Elem]) {
    if q.is_empty() {
        return;
    }
    introsort_loop(q, 2 * lg(q.len()));
    if q.len() > 16 {
        insertion_sort(&mut q[..16]);
        for i in 16..q.len() {
            unguarded_linear_insert(q, i);
        }
    } else {
        insertion_sort(q);
    }
}

fn introsort_loop(q: &mut [Elem], mut depth: usize) {
    let mut last = q.len();
    while last > 16 {
        if depth == 0 {
            partial_sort(&mut q[..last], last);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(&mut q[..last]);
        introsort_loop(&mut q[cut..last], depth);
        last = cut;
    }
}

/// `__unguarded_partition_pivot`: the median of (second, middle, last) moved to the front, then
/// a Hoare partition around it; returns the cut.
fn partition_pivot(q: &mut [Elem]) -> usize {
    let (mid, last) = (q.len() / 2, q.len() - 1);
    move_median_to_first(q, 1, mid, last);
    let (mut lo, mut hi) = (1usize, q.len());
    loop {
        while comp(&q[lo], &q[0]) {
            lo += 1;
        }
        hi -= 1;
        while comp(&q[0], &q[hi]) {
            hi -= 1;
        }
        if lo >= hi {
            return lo;
        }
        q.swap(lo, hi);
        lo += 1;
    }
}

fn move_median_to_first(q: &mut [Elem], a: usize, b: usize, c: usize) {
    let pick = if comp(&q[a], &q[b]) {
        if comp(&q[b], &q[c]) {
            b
        } else if comp(&q[a], &q[c]) {
            c
        } else {
            a
        }
    } else if comp(&q[a], &q[c]) {
        a
    } else if comp(&q[b], &q[c]) {
        c
    } else {
        b
    };
    q.swap(0, pick);
}

fn insertion_sort(q: &mut [Elem]) {
    for i in 1..q.len() {
        if comp(&q[i], &q[0]) {
            q[..=i].rotate_right(1);
        } else {
            unguarded_linear_insert(q, i);
        }
    }
}

fn unguarded_linear_insert(q: &mut [Elem], mut last: usize) {
    let val = q[last];
    while comp(&val, &q[last - 1]) {
        q[last] = q[last - 1];
        last -= 1;
    }
    q[last] = val;
}

/// `std::partial_sort(first, first + middle, last)`.
fn partial_sort(q: &mut [Elem], middle: usize) {
    heap_select(q, middle);
    let mut last = middle;
    while last > 1 {
        last -= 1;
        pop_heap(q, last, last);
    }
}

fn heap_select(q: &mut [Elem], middle: usize) {
    make_heap(&mut q[..middle]);
    for i in middle..q.len() {
        if comp(&q[i], &q[0]) {
            pop_heap(q, middle, i);
        }
    }
}

fn make_heap(q: &mut [Elem]) {
    let len = q.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = q[parent];
        adjust_heap(q, parent, len, value);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// `__pop_heap(first, first + len, first + result)`.
fn pop_heap(q: &mut [Elem], len: usize, result: usize) {
    let value = q[result];
    q[result] = q[0];
    adjust_heap(q, 0, len, value);
}

fn adjust_heap(q: &mut [Elem], mut hole: usize, len: usize, value: Elem) {
    let top = hole;
    let mut child = hole;
    while child + 1 < len.div_ceil(2) {
        // (len - 1) / 2 in libstdc++'s signed arithmetic
        child = 2 * (child + 1);
        if comp(&q[child], &q[child - 1]) {
            child -= 1;
        }
        q[hole] = q[child];
        hole = child;
    }
    if len.is_multiple_of(2) && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        q[hole] = q[child - 1];
        hole = child - 1;
    }
    // __push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(&q[parent], &value) {
            break;
        }
        q[hole] = q[parent];
        hole = parent;
    }
    q[hole] = value;
}

#[cfg(test)]
mod tests {
    use super::topk;

    /// Indices torch 2.15.0 (CPU) returns: `torch.topk(torch.tensor([values]), k).indices`.
    #[test]
    fn equal_values_come_out_as_torch_orders_them() {
        let cases: Vec<(Vec<f32>, usize, Vec<usize>)> = vec![
            (vec![0.0, 2.0, 1.0, 2.0, 2.0], 2, vec![1, 4]),
            (vec![0.0; 6], 3, vec![3, 5, 4]),
            (vec![0.0; 8], 3, vec![6, 5, 4]),
            (vec![0.0; 128], 8, vec![84, 87, 86, 85, 82, 81, 88, 83]),
            (
                (0..128).map(|i| if i % 3 == 0 { 1.0 } else { 0.5 }).collect(),
                8,
                vec![42, 93, 51, 48, 96, 45, 99, 30],
            ),
            ((0..64).map(|i| (i % 5) as f32).collect(), 8, vec![14, 39, 54, 24, 44, 19, 9, 49]),
            ((0..20).map(|i| ((i * 7) % 4) as f32).collect(), 4, vec![13, 5, 1, 9]),
            (vec![0.0; 600], 8, vec![7, 4, 1, 3, 5, 0, 2, 6]),
            ((0..600).map(|i| (i % 3) as f32).collect(), 8, vec![14, 11, 20, 17, 5, 23, 8, 2]),
        ];
        for (values, k, want) in cases {
            assert_eq!(topk(&values, k), want, "{} values, k {k}", values.len());
        }
    }

    #[test]
    fn distinct_values_come_out_largest_first() {
        let v = [0.1, 0.7, 0.3, 0.9, 0.5, f32::NAN, 0.2];
        assert_eq!(topk(&v, 3), vec![5, 3, 1]);
        let v: Vec<f32> = (0..300).map(|i| ((i * 37) % 300) as f32).collect();
        let want: Vec<usize> =
            (0..5).map(|r| v.iter().position(|&x| x == (299 - r) as f32).unwrap()).collect();
        assert_eq!(topk(&v, 5), want);
    }
}
