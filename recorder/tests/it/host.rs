//! `HostDevice`: the allocator over real host memory.

use memsnap_recorder::{CachingAllocator, Device, Error, HistoryOptions, HostDevice, Stream};

use super::common::assert_sound;

#[test]
fn host_device_allocates_real_memory_and_returns_it() {
    let alloc = CachingAllocator::new(HostDevice::new(64 << 20));
    alloc.record_memory_history(HistoryOptions::without_stacks());
    let small = alloc.malloc(1000, Stream(0)).unwrap();
    let large = alloc.malloc(12 << 20, Stream(0)).unwrap();
    assert_eq!(small % 512, 0);
    assert!(matches!(
        alloc.malloc(60 << 20, Stream(0)),
        Err(Error::OutOfMemory(_))
    ));
    alloc.free(small).unwrap();
    alloc.free(large).unwrap();
    alloc.empty_cache().unwrap();
    assert_sound(&alloc, "host device");
    assert_eq!(alloc.device().mem_info().unwrap().free, 64 << 20);
}
