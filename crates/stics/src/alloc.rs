//! Process-wide allocator settings: the binary's decision, never a library's.

/// Tunes the C allocator for a storage server; call once at start, before the runtime.
///
/// Large read buffers (a 1 MiB READ allocates 1 MiB) would otherwise be mapped and unmapped on
/// every command, glibc's default for blocks above its mmap threshold, and each fresh mapping
/// costs a page fault per 4 KiB: a fifth of the CPU time of 1 MiB reads. Keeping such blocks on
/// the heap and not trimming it eagerly makes them reusable.
#[allow(unsafe_code, reason = "mallopt is a C call; see the SAFETY note")]
pub fn tune_for_storage_server() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; it takes plain integers and is safe
        // to call at any time (glibc serialises it internally).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    }
}
