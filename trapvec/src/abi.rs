//! The trap ABI shared with `kmod/` (`kmod/trapvec_abi.h`) and with components
//! (`components/include/trapvec.h`).

/// Interrupt vector of the trap: 0xF5 is an unused system vector on Linux 6.1 x86-64 (it was
/// UV_BAU), so the interrupt matrix never hands it to a device.
pub const TRAP_VECTOR: u8 = 0xF5;

/// The trap written over a point: `int 0xF5`.
pub const TRAP_BYTES: [u8; 2] = [0xCD, TRAP_VECTOR];

/// The one-byte breakpoint written first by the int3-first protocol.
pub const INT3: u8 = 0xCC;

/// Error code of the #GP a user-mode `int 0xF5` raises: the IDT entry index with the IDT bit.
pub const USER_TRAP_ERROR_CODE: u64 = ((TRAP_VECTOR as u64) << 3) | 2;

/// Registers handed to a `call` handler, `struct trapvec_regs` in `components/include/trapvec.h`.
///
/// A handler may change any general register; `rsp` and `rip` are informational (the value at the
/// point and the point's address) and writes to them are ignored. Trampolines build exactly this
/// layout on the stack, so the field order is ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecRegs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rax: u64,
    pub rsp: u64,
    pub rip: u64,
    pub rflags: u64,
}

const _: () = assert!(core::mem::size_of::<TrapvecRegs>() == 18 * 8);
