// wgmma shared-memory matrix descriptors with the 128-byte swizzle, for host and device code alike:
// the kernel (hopper_ptx.cuh and above) builds them, and tests/gpu/hopper checks desc_advance
// against smem_desc_sw128 by brute force on the host.
#pragma once

#include <cstdint>

#include "core/hd.hpp"

namespace ringattn::cuda::hopper {

// Shared-memory addresses of a CTA are below this (the start address field has 14 bits of
// address >> 4); the H200 gives a CTA at most 227 KB.
inline constexpr uint32_t kDescAddressLimit = 1u << 18;

// Shared-memory matrix descriptor with the 128-byte swizzle (layout type 1 in bits 62-63).
// Addresses and byte offsets are stored >> 4. For K-major operands the leading offset is unused
// (set to 1) and the stride offset is the distance between 8-row groups (1024 bytes); for
// N-major operands the leading offset is the distance between 64-element column blocks and the
// stride offset the distance between 8-row groups along K.
RA_HD uint64_t smem_desc_sw128(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  uint64_t d = 0;
  d |= uint64_t((addr & (kDescAddressLimit - 1)) >> 4);
  d |= uint64_t((lead_bytes >> 4) & 0x3FFF) << 16;
  d |= uint64_t((stride_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

// The descriptor of the operand `bytes` further on (a multiple of 16): only the start address
// field (bits 0-13) changes, and while the address stays below kDescAddressLimit it never
// carries into the bits above; one 32-bit add, where smem_desc_sw128 takes four. Equal to
// smem_desc_sw128(addr + bytes, ...) there (tests/gpu/hopper, HopperDescriptor).
RA_HD uint64_t desc_advance(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(d) + (bytes >> 4));
}

}  // namespace ringattn::cuda::hopper
