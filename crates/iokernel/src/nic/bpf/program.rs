//! iokerneld's XDP program, in named instructions ([`super::asm`]).
//!
//! ```text
//! eth = ctx->data; if eth + 14 > ctx->data_end: PASS
//! IPv4 (ethertype 0x0800, no VLAN tag):
//!     header of 20 bytes in the frame, version 4, IHL ≥ 5, else PASS
//!     key = destination address
//! ARP (0x0806): 28 bytes in the frame, Ethernet/IPv4 (htype 1, ptype
//!     0x0800, hlen 6, plen 4), else PASS
//!     key = target protocol address (requests and replies alike)
//! any other ethertype (IPv6, VLAN-tagged, LLDP...): PASS
//! value = addresses[key]; missing: PASS
//! value ≠ 0 (an application's own socket, the direct path):
//!     if bpf_redirect_map(&own, (value - 1) * queues + ctx->rx_queue_index, 0)
//!         == XDP_REDIRECT: return XDP_REDIRECT
//!     (no socket of its own on this queue: on to iokerneld's)
//! return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS)
//! ```
//!
//! Every packet read is preceded by a bounds check against `data_end` (the
//! verifier refuses the program otherwise). Multi-byte fields are loaded
//! as they lie in the frame, big-endian, and compared with constants
//! converted the same way ([`wire16`]); the address key is the four bytes
//! of the destination as on the wire, which is how userspace writes it
//! ([`std::net::Ipv4Addr::octets`]).

use super::asm::{Alu, Asm, AsmError, Cond, Insn, Reg, Size};

/// `struct xdp_md` offsets.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;

const ETH_HEADER: i32 = 14;
const ETH_TYPE: i16 = 12;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;

/// IPv4 header fields, from the start of the frame.
const IPV4_VERSION_IHL: i16 = 14;
const IPV4_DST: i16 = 14 + 16;
const IPV4_MIN_END: i32 = ETH_HEADER + 20;

/// ARP fields, from the start of the frame.
const ARP_HTYPE: i16 = 14;
const ARP_PTYPE: i16 = 14 + 2;
const ARP_HLEN: i16 = 14 + 4;
const ARP_PLEN: i16 = 14 + 5;
const ARP_TPA: i16 = 14 + 24;
const ARP_END: i32 = ETH_HEADER + 28;
const ARP_HTYPE_ETHERNET: u16 = 1;

pub const XDP_PASS: i32 = 2;
const XDP_REDIRECT: i32 = 4;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;

/// `value` as a 16-bit load of its big-endian bytes reads on this host.
const fn wire16(value: u16) -> i32 {
    u16::from_ne_bytes(value.to_be_bytes()) as i32
}

/// The program, over the address map `addresses` (4-byte IPv4 key), the
/// socket map `xsks` (iokerneld's, by receive queue) and the socket map
/// `own` (applications' own sockets: slot × `queues` + receive queue).
pub fn ginza_frames(
    addresses: i32,
    xsks: i32,
    own: i32,
    queues: u32,
) -> Result<Vec<Insn>, AsmError> {
    use Reg::*;
    let mut a = Asm::new();
    // r6 = ctx (kept across calls); r2 = data, r3 = data_end.
    a.mov_reg(R6, R1)
        .load(Size::W, R2, R1, MD_DATA)
        .load(Size::W, R3, R1, MD_DATA_END)
        .mov_reg(R4, R2)
        .alu_imm(Alu::Add, R4, ETH_HEADER)
        .jump_reg(Cond::Gt, R4, R3, "pass")
        .load(Size::H, R5, R2, ETH_TYPE)
        .jump_imm(Cond::Eq, R5, wire16(ETHERTYPE_IPV4), "ipv4")
        .jump_imm(Cond::Eq, R5, wire16(ETHERTYPE_ARP), "arp")
        .jump("pass");

    a.label("ipv4")
        .mov_reg(R4, R2)
        .alu_imm(Alu::Add, R4, IPV4_MIN_END)
        .jump_reg(Cond::Gt, R4, R3, "pass")
        .load(Size::B, R5, R2, IPV4_VERSION_IHL)
        .mov_reg(R7, R5)
        .alu_imm(Alu::Rsh, R7, 4)
        .jump_imm(Cond::Ne, R7, 4, "pass")
        .alu_imm(Alu::And, R5, 0x0f)
        .jump_imm(Cond::Lt, R5, 5, "pass")
        .load(Size::W, R5, R2, IPV4_DST)
        .jump("lookup");

    a.label("arp")
        .mov_reg(R4, R2)
        .alu_imm(Alu::Add, R4, ARP_END)
        .jump_reg(Cond::Gt, R4, R3, "pass")
        .load(Size::H, R5, R2, ARP_HTYPE)
        .jump_imm(Cond::Ne, R5, wire16(ARP_HTYPE_ETHERNET), "pass")
        .load(Size::H, R5, R2, ARP_PTYPE)
        .jump_imm(Cond::Ne, R5, wire16(ETHERTYPE_IPV4), "pass")
        .load(Size::B, R5, R2, ARP_HLEN)
        .jump_imm(Cond::Ne, R5, 6, "pass")
        .load(Size::B, R5, R2, ARP_PLEN)
        .jump_imm(Cond::Ne, R5, 4, "pass")
        .load(Size::W, R5, R2, ARP_TPA);

    // r5 = the address, as on the wire: is it a Ginza application's?
    a.label("lookup")
        .store(Size::W, R10, -4, R5)
        .mov_reg(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, addresses)
        .call(BPF_FUNC_MAP_LOOKUP_ELEM)
        .jump_imm(Cond::Eq, R0, 0, "pass")
        // Ours. An application's own socket on this queue, if its value
        // names one (a miss returns 0, XDP_ABORTED: on to iokerneld's).
        .load(Size::W, R2, R0, 0)
        .jump_imm(Cond::Eq, R2, 0, "switch")
        .alu_imm(Alu::Add, R2, -1)
        .alu_imm(Alu::Mul, R2, queues as i32)
        .load(Size::W, R3, R6, MD_RX_QUEUE_INDEX)
        .alu_reg(Alu::Add, R2, R3)
        .load_map_fd(R1, own)
        .mov_imm(R3, 0)
        .call(BPF_FUNC_REDIRECT_MAP)
        .jump_imm(Cond::Eq, R0, XDP_REDIRECT, "done");

    // iokerneld's socket on the queue it came in on, or Linux if that
    // queue has none.
    a.label("switch")
        .load(Size::W, R2, R6, MD_RX_QUEUE_INDEX)
        .load_map_fd(R1, xsks)
        .mov_imm(R3, XDP_PASS)
        .call(BPF_FUNC_REDIRECT_MAP);
    a.label("done").exit();

    a.label("pass").mov_imm(R0, XDP_PASS).exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_assembles_with_both_maps() {
        let insns = ginza_frames(7, 8, 9, 4).unwrap();
        let map_loads: Vec<i32> = insns
            .iter()
            .filter(|i| i.code == 0x18)
            .map(|i| i.imm)
            .collect();
        assert_eq!(map_loads, [7, 9, 8]);
        // Ends in `r0 = XDP_PASS; exit`.
        let n = insns.len();
        assert_eq!((insns[n - 2].code, insns[n - 2].imm), (0xb7, XDP_PASS));
        assert_eq!(insns[n - 1].code, 0x95);
        // Every jump lands inside the program.
        for (at, insn) in insns.iter().enumerate() {
            if insn.code & 0x07 == 0x05 && !matches!(insn.code, 0x85 | 0x95) {
                let target = at as i64 + 1 + insn.off as i64;
                assert!((0..n as i64).contains(&target), "jump at {at}");
            }
        }
    }

    #[test]
    fn wire_constants_read_as_loaded() {
        let frame = [0x08u8, 0x06];
        let loaded = u16::from_ne_bytes(frame) as i32;
        assert_eq!(loaded, wire16(ETHERTYPE_ARP));
    }
}
