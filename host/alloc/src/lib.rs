//! The process's allocator: mimalloc (docs/decisions.md, "mimalloc is the process's allocator"),
//! called the way its fast path answers.
//!
//! Every Rust allocation names an alignment. The `mimalloc` crate passes each one to
//! `mi_malloc_aligned`, whose fast path takes a block only while the size class's free list has
//! one; when it runs dry, mimalloc 3 serves a block size that is not a power of two (24, 48, 80
//! bytes…) by over-allocating from a larger class and aligning inside it, and never refills the
//! class it was asked for, so such sizes stay on that slow path and in blocks a class too large
//! (mimalloc issue 889, mimalloc_rust pull request 170). Yet `mi_malloc` already aligns every
//! block at least as strictly as its size needs: classes of two words and more are multiples
//! of 16 bytes starting 16-aligned, the one-word class holds 8-byte blocks. So an alignment of
//! at most 16 that does not exceed the size (every Rust type's, whose size is a multiple of its
//! alignment) takes the plain calls, as std's own `System` does with glibc's `malloc`; a
//! stricter one (a cache-padded value) or a size below its alignment keeps the aligned calls.
//! `mi_free` and `mi_realloc` take a block from either.

#![allow(unsafe_code)]

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The alignment every block of `mi_malloc` has once its size is at least this large
/// (`MI_MAX_ALIGN_SIZE` on 64-bit targets); smaller blocks are word-aligned.
const PLAIN_ALIGN: usize = 16;

/// mimalloc as the global allocator: `#[global_allocator] static A: Allocator = Allocator;`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Allocator;

/// Whether `mi_malloc(size)` returns a block aligned to `align`.
#[inline]
fn plain(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every call hands mimalloc a size and alignment Rust's allocator contract allows; a
// block is freed or resized only by mimalloc, which accepts blocks of both its plain and its
// aligned calls; `plain` holds only where `mi_malloc`'s blocks meet the layout's alignment.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(layout.size(), layout.align()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(layout.size(), layout.align()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(new_size, layout.align()) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout the plain calls serve gets a block aligned as it asks, through allocation,
    /// zeroed allocation and growth, over enough blocks of each size to cross pages.
    #[test]
    fn plain_blocks_meet_their_alignment() {
        let a = Allocator;
        for align in [1usize, 2, 4, 8, 16] {
            for size in (align..=2048).step_by(align) {
                let layout = Layout::from_size_align(size, align).unwrap_or_else(|e| panic!("{e}"));
                let mut blocks = Vec::new();
                for i in 0..64 {
                    // SAFETY: a non-zero size; each block is freed below with its layout.
                    let p = unsafe {
                        if i % 2 == 0 {
                            a.alloc(layout)
                        } else {
                            a.alloc_zeroed(layout)
                        }
                    };
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                    blocks.push(p);
                }
                for p in blocks {
                    // SAFETY: `p` came from `alloc` with `layout`.
                    let q = unsafe { a.realloc(p, layout, size * 3) };
                    assert_eq!(
                        q as usize % align,
                        0,
                        "grown to {}, align {align}",
                        size * 3
                    );
                    // SAFETY: `q` is the block `realloc` returned, now of `size * 3` bytes.
                    unsafe {
                        a.dealloc(q, Layout::from_size_align_unchecked(size * 3, align));
                    }
                }
            }
        }
    }

    /// Stricter alignments, and sizes below their alignment, keep the aligned calls.
    #[test]
    fn strict_alignments_are_met() {
        let a = Allocator;
        for align in [32usize, 64, 128, 4096] {
            for size in [1usize, align / 2, align, align * 3] {
                let layout = Layout::from_size_align(size, align).unwrap_or_else(|e| panic!("{e}"));
                // SAFETY: a non-zero size, freed below with its layout.
                let p = unsafe { a.alloc(layout) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                // SAFETY: as above.
                unsafe { a.dealloc(p, layout) };
            }
        }
        let small = Layout::from_size_align(4, 8).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: as above.
        let p = unsafe { a.alloc_zeroed(small) };
        assert_eq!(p as usize % 8, 0);
        // SAFETY: as above.
        unsafe { a.dealloc(p, small) };
    }
}
