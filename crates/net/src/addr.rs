//! Addresses and the interface configuration.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::str::FromStr;

/// An Ethernet (EUI-48) address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    pub fn is_broadcast(self) -> bool {
        self == Self::BROADCAST
    }

    /// The group bit: broadcast and multicast frames have it set.
    pub fn is_multicast(self) -> bool {
        self.0[0] & 0x01 != 0
    }

    pub(crate) fn to_wire(self) -> smoltcp::wire::EthernetAddress {
        smoltcp::wire::EthernetAddress(self.0)
    }

    /// The first six bytes of `bytes`; `None` when there are fewer.
    pub(crate) fn from_slice(bytes: &[u8]) -> Option<MacAddr> {
        bytes.get(..6)?.try_into().ok().map(MacAddr)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A MAC address string that is not six colon-separated hex octets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {0:?}: expected six hex octets separated by ':' (02:00:00:00:00:01)")]
pub struct MacAddrParseError(pub String);

impl FromStr for MacAddr {
    type Err = MacAddrParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || MacAddrParseError(text.to_owned());
        let mut octets = [0u8; 6];
        let mut parts = text.split(':');
        for octet in &mut octets {
            let part = parts.next().ok_or_else(error)?;
            // from_str_radix accepts a leading '+', which is not a MAC address.
            if part.is_empty() || part.len() > 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(error());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| error())?;
        }
        if parts.next().is_some() {
            return Err(error());
        }
        Ok(MacAddr(octets))
    }
}

// MACs appear in configuration files, so they are written the way people read
// them ("02:00:00:00:00:01"), not as a byte array.
impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One end of a UDP (later TCP) flow.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
}

impl Endpoint {
    pub const fn new(ip: Ipv4Addr, port: u16) -> Endpoint {
        Endpoint { ip, port }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ip, self.port)
    }
}

impl From<SocketAddrV4> for Endpoint {
    fn from(addr: SocketAddrV4) -> Endpoint {
        Endpoint::new(*addr.ip(), addr.port())
    }
}

impl From<Endpoint> for SocketAddrV4 {
    fn from(endpoint: Endpoint) -> SocketAddrV4 {
        SocketAddrV4::new(endpoint.ip, endpoint.port)
    }
}

/// Our side of the link: the addresses frames must carry to be for us, and
/// the ones we send from.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parses_and_prints() {
        let mac: MacAddr = "02:00:0a:FF:00:01".parse().unwrap();
        assert_eq!(mac, MacAddr([2, 0, 0x0a, 0xff, 0, 1]));
        assert_eq!(mac.to_string(), "02:00:0a:ff:00:01");
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "02:00:00:00:00:+1",
            "002:0:0:0:0:1",
            "zz:00:00:00:00:01",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn interface_round_trips_through_toml() {
        let text = "mac = \"02:00:00:00:00:01\"\nip = \"10.0.0.1\"\n";
        let iface: Interface = toml::from_str(text).unwrap();
        assert_eq!(iface.mac, MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(iface.ip, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(toml::to_string(&iface).unwrap(), text);
        let error = toml::from_str::<Interface>("mac = \"nope\"\nip = \"10.0.0.1\"\n").unwrap_err();
        assert!(error.to_string().contains("invalid MAC address"), "{error}");
    }

    #[test]
    fn multicast_bit() {
        assert!(MacAddr::BROADCAST.is_multicast());
        assert!(MacAddr([0x01, 0, 0x5e, 0, 0, 1]).is_multicast());
        assert!(!MacAddr([0x02, 0, 0, 0, 0, 1]).is_multicast());
    }
}
