//! A small eBPF assembler: named registers, instructions and jumps to
//! labels, encoded as the kernel's `struct bpf_insn`
//! (Documentation/bpf/standardization/instruction-set.rst).
//!
//! Only what iokerneld's XDP program needs: 64-bit ALU on registers and
//! immediates, loads and stores of 1, 2, 4 and 8 bytes, the 16-byte load
//! of a map's descriptor, conditional jumps, helper calls and exit. Jumps
//! name a label; [`Asm::finish`] resolves them (forward or backward) and
//! refuses a label never placed, placed twice, or too far away.

use std::collections::HashMap;
use std::fmt;

/// `struct bpf_insn`: opcode, destination register (low nibble) and source
/// register (high nibble), signed offset, signed immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (dst as u8) | ((src as u8) << 4),
            off,
            imm,
        }
    }

    /// Its 8 bytes as the kernel reads them (little-endian host).
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_ne_bytes());
        b[4..8].copy_from_slice(&self.imm.to_ne_bytes());
        b
    }
}

/// The eleven registers: R0 holds return values, R1–R5 arguments (clobbered
/// by calls), R6–R9 survive calls, R10 is the read-only frame pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reg {
    R0 = 0,
    R1,
    R2,
    R3,
    R4,
    R5,
    R6,
    R7,
    R8,
    R9,
    R10,
}

/// Bytes moved by a load or store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    B = 0x10,
    H = 0x08,
    W = 0x00,
    DW = 0x18,
}

/// 64-bit ALU operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alu {
    Add = 0x00,
    Sub = 0x10,
    Mul = 0x20,
    Or = 0x40,
    And = 0x50,
    Lsh = 0x60,
    Rsh = 0x70,
    Xor = 0xa0,
    Mov = 0xb0,
}

/// Conditions of a jump (unsigned comparisons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    Eq = 0x10,
    Gt = 0x20,
    Ge = 0x30,
    Ne = 0x50,
    Lt = 0xa0,
    Le = 0xb0,
}

// Instruction classes and fields.
const CLASS_LD: u8 = 0x00;
const CLASS_LDX: u8 = 0x01;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;
const CLASS_JMP: u8 = 0x05;
const CLASS_ALU64: u8 = 0x07;
const MODE_IMM: u8 = 0x00;
const MODE_MEM: u8 = 0x60;
const SOURCE_IMM: u8 = 0x00;
const SOURCE_REG: u8 = 0x08;
const JMP_JA: u8 = 0x00;
const JMP_CALL: u8 = 0x80;
const JMP_EXIT: u8 = 0x90;
/// `src_reg` of a 16-byte load whose immediate is a map's descriptor.
const PSEUDO_MAP_FD: u8 = 1;

/// Why a program could not be assembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsmError {
    UndefinedLabel(&'static str),
    DuplicateLabel(&'static str),
    JumpTooFar { label: &'static str, from: usize },
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsmError::UndefinedLabel(l) => write!(f, "jump to label {l:?}, never placed"),
            AsmError::DuplicateLabel(l) => write!(f, "label {l:?} placed twice"),
            AsmError::JumpTooFar { label, from } => write!(
                f,
                "jump from instruction {from} to label {label:?} exceeds a 16-bit offset"
            ),
        }
    }
}

impl std::error::Error for AsmError {}

/// A program being written: instructions in order, labels, and the jumps
/// still to resolve.
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: HashMap<&'static str, usize>,
    duplicate: Option<&'static str>,
    /// (instruction index, label) of each jump.
    jumps: Vec<(usize, &'static str)>,
}

impl Asm {
    pub fn new() -> Asm {
        Asm::default()
    }

    fn push(&mut self, insn: Insn) -> &mut Asm {
        self.insns.push(insn);
        self
    }

    /// Places `name` at the next instruction.
    pub fn label(&mut self, name: &'static str) -> &mut Asm {
        if self.labels.insert(name, self.insns.len()).is_some() {
            self.duplicate.get_or_insert(name);
        }
        self
    }

    /// `dst op= imm` (64-bit).
    pub fn alu_imm(&mut self, op: Alu, dst: Reg, imm: i32) -> &mut Asm {
        self.push(Insn::new(
            CLASS_ALU64 | op as u8 | SOURCE_IMM,
            dst,
            Reg::R0,
            0,
            imm,
        ))
    }

    /// `dst op= src` (64-bit).
    pub fn alu_reg(&mut self, op: Alu, dst: Reg, src: Reg) -> &mut Asm {
        self.push(Insn::new(
            CLASS_ALU64 | op as u8 | SOURCE_REG,
            dst,
            src,
            0,
            0,
        ))
    }

    /// `dst = imm`.
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) -> &mut Asm {
        self.alu_imm(Alu::Mov, dst, imm)
    }

    /// `dst = src`.
    pub fn mov_reg(&mut self, dst: Reg, src: Reg) -> &mut Asm {
        self.alu_reg(Alu::Mov, dst, src)
    }

    /// `dst = *(size *)(src + off)`, zero-extended.
    pub fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) -> &mut Asm {
        self.push(Insn::new(
            CLASS_LDX | size as u8 | MODE_MEM,
            dst,
            src,
            off,
            0,
        ))
    }

    /// `*(size *)(dst + off) = src`.
    pub fn store(&mut self, size: Size, dst: Reg, off: i16, src: Reg) -> &mut Asm {
        self.push(Insn::new(
            CLASS_STX | size as u8 | MODE_MEM,
            dst,
            src,
            off,
            0,
        ))
    }

    /// `*(size *)(dst + off) = imm`.
    pub fn store_imm(&mut self, size: Size, dst: Reg, off: i16, imm: i32) -> &mut Asm {
        self.push(Insn::new(
            CLASS_ST | size as u8 | MODE_MEM,
            dst,
            Reg::R0,
            off,
            imm,
        ))
    }

    /// `dst = the map whose descriptor is `fd`` (two instruction slots; the
    /// kernel replaces the descriptor by the map's address).
    pub fn load_map_fd(&mut self, dst: Reg, fd: i32) -> &mut Asm {
        self.push(Insn {
            code: CLASS_LD | Size::DW as u8 | MODE_IMM,
            regs: dst as u8 | (PSEUDO_MAP_FD << 4),
            off: 0,
            imm: fd,
        });
        self.push(Insn::new(0, Reg::R0, Reg::R0, 0, 0))
    }

    /// `if dst cond imm goto label`.
    pub fn jump_imm(&mut self, cond: Cond, dst: Reg, imm: i32, label: &'static str) -> &mut Asm {
        self.jumps.push((self.insns.len(), label));
        self.push(Insn::new(
            CLASS_JMP | cond as u8 | SOURCE_IMM,
            dst,
            Reg::R0,
            0,
            imm,
        ))
    }

    /// `if dst cond src goto label`.
    pub fn jump_reg(&mut self, cond: Cond, dst: Reg, src: Reg, label: &'static str) -> &mut Asm {
        self.jumps.push((self.insns.len(), label));
        self.push(Insn::new(
            CLASS_JMP | cond as u8 | SOURCE_REG,
            dst,
            src,
            0,
            0,
        ))
    }

    /// `goto label`.
    pub fn jump(&mut self, label: &'static str) -> &mut Asm {
        self.jumps.push((self.insns.len(), label));
        self.push(Insn::new(CLASS_JMP | JMP_JA, Reg::R0, Reg::R0, 0, 0))
    }

    /// `r0 = helper(r1, ..., r5)`, by the helper's number
    /// (`enum bpf_func_id`).
    pub fn call(&mut self, helper: i32) -> &mut Asm {
        self.push(Insn::new(CLASS_JMP | JMP_CALL, Reg::R0, Reg::R0, 0, helper))
    }

    /// `return r0`.
    pub fn exit(&mut self) -> &mut Asm {
        self.push(Insn::new(CLASS_JMP | JMP_EXIT, Reg::R0, Reg::R0, 0, 0))
    }

    /// The instructions, every jump's offset resolved (relative to the
    /// instruction after the jump, in 8-byte slots).
    pub fn finish(&self) -> Result<Vec<Insn>, AsmError> {
        if let Some(name) = self.duplicate {
            return Err(AsmError::DuplicateLabel(name));
        }
        let mut insns = self.insns.clone();
        for &(at, label) in &self.jumps {
            let target = *self
                .labels
                .get(label)
                .ok_or(AsmError::UndefinedLabel(label))?;
            let off = i16::try_from(target as i64 - at as i64 - 1)
                .map_err(|_| AsmError::JumpTooFar { label, from: at })?;
            insns[at].off = off;
        }
        Ok(insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodings as the instruction-set document's tables give them: opcode
    /// byte, registers (dst low nibble, src high), offset, immediate.
    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        let mut a = Asm::new();
        a.load(Size::W, Reg::R2, Reg::R1, 16) // r2 = *(u32 *)(r1 + 16)
            .load(Size::H, Reg::R5, Reg::R2, 12) // r5 = *(u16 *)(r2 + 12)
            .load(Size::B, Reg::R5, Reg::R2, 14) // r5 = *(u8 *)(r2 + 14)
            .store(Size::W, Reg::R10, -4, Reg::R5) // *(u32 *)(r10 - 4) = r5
            .store_imm(Size::DW, Reg::R10, -8, 7) // *(u64 *)(r10 - 8) = 7
            .mov_imm(Reg::R3, 2) // r3 = 2
            .mov_reg(Reg::R6, Reg::R1) // r6 = r1
            .alu_imm(Alu::Add, Reg::R2, -4) // r2 += -4
            .alu_imm(Alu::Rsh, Reg::R7, 4) // r7 >>= 4
            .alu_imm(Alu::And, Reg::R5, 0x0f) // r5 &= 15
            .call(51)
            .exit();
        let bytes: Vec<[u8; 8]> = a
            .finish()
            .unwrap()
            .into_iter()
            .map(Insn::to_bytes)
            .collect();
        let expected: [[u8; 8]; 12] = [
            [0x61, 0x12, 0x10, 0x00, 0, 0, 0, 0],
            [0x69, 0x25, 0x0c, 0x00, 0, 0, 0, 0],
            [0x71, 0x25, 0x0e, 0x00, 0, 0, 0, 0],
            [0x63, 0x5a, 0xfc, 0xff, 0, 0, 0, 0],
            [0x7a, 0x0a, 0xf8, 0xff, 7, 0, 0, 0],
            [0xb7, 0x03, 0, 0, 2, 0, 0, 0],
            [0xbf, 0x16, 0, 0, 0, 0, 0, 0],
            [0x07, 0x02, 0, 0, 0xfc, 0xff, 0xff, 0xff],
            [0x77, 0x07, 0, 0, 4, 0, 0, 0],
            [0x57, 0x05, 0, 0, 0x0f, 0, 0, 0],
            [0x85, 0x00, 0, 0, 51, 0, 0, 0],
            [0x95, 0x00, 0, 0, 0, 0, 0, 0],
        ];
        if cfg!(target_endian = "little") {
            assert_eq!(bytes, expected);
        }
    }

    #[test]
    fn a_map_load_takes_two_slots_and_marks_the_descriptor() {
        let mut a = Asm::new();
        a.load_map_fd(Reg::R1, 9);
        let insns = a.finish().unwrap();
        assert_eq!(insns.len(), 2);
        assert_eq!(insns[0].code, 0x18);
        assert_eq!(insns[0].regs, 0x11, "dst r1, src BPF_PSEUDO_MAP_FD");
        assert_eq!(insns[0].imm, 9);
        assert_eq!(insns[1], Insn::new(0, Reg::R0, Reg::R0, 0, 0));
    }

    #[test]
    fn jumps_resolve_forward_and_backward_counting_wide_loads() {
        let mut a = Asm::new();
        a.label("top")
            .jump_imm(Cond::Eq, Reg::R1, 0x0008, "end") // 0
            .load_map_fd(Reg::R1, 3) // 1, 2
            .jump_reg(Cond::Gt, Reg::R4, Reg::R3, "top") // 3
            .jump("end") // 4
            .label("end")
            .exit(); // 5
        let insns = a.finish().unwrap();
        assert_eq!(insns[0].off, 4);
        assert_eq!(insns[0].code, 0x15);
        assert_eq!(insns[0].imm, 8);
        assert_eq!(insns[3].off, -4);
        assert_eq!((insns[3].code, insns[3].regs), (0x2d, 0x34));
        assert_eq!((insns[4].code, insns[4].off), (0x05, 0));
    }

    #[test]
    fn bad_labels_are_named() {
        let mut a = Asm::new();
        a.jump("nowhere").exit();
        assert_eq!(
            a.finish().unwrap_err().to_string(),
            "jump to label \"nowhere\", never placed"
        );
        let mut a = Asm::new();
        a.label("twice").exit().label("twice").exit();
        assert_eq!(a.finish().unwrap_err(), AsmError::DuplicateLabel("twice"));
        let mut a = Asm::new();
        a.jump("far");
        for _ in 0..40_000 {
            a.exit();
        }
        a.label("far").exit();
        assert_eq!(
            a.finish().unwrap_err(),
            AsmError::JumpTooFar {
                label: "far",
                from: 0
            }
        );
    }
}
