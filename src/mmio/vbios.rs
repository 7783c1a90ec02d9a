//! The VBIOS the virtual Quadro 6000 offers: an image the project generates from the documented
//! structures (`gf100::vbios`), not a copy of NVIDIA's. nouveau reads it through the PROM window
//! in BAR0 (0x300000); it is all nouveau needs to accept a BIOS and skip devinit:
//!
//! - a PC option-ROM header (55 AA, length in 512-byte units, pointer to the PCI data
//!   structure at 0x18, DCB pointer at 0x36 = 0: no display outputs);
//! - a PCI data structure (vendor 0x10de, device 0x06d8, class 03 00 00, code type 0, last
//!   image);
//! - a BIT table with the two tokens nouveau's DRM layer requires: 'i' (version 70.00.c0.00.01,
//!   no features) and 'I' (init tables: an empty script list, so devinit runs no script);
//! - a byte sum of 0 over the image (nouveau scores a checksummed PROM image 4).
//!
//! No BIT 'C' (PLL limits: nouveau then uses its defaults), 'M' (memory types), 'P'
//! (performance levels): nouveau logs warnings for them and continues. Everything is
//! read-only: writes to the window are dropped.

use gf100::pci;
use gf100::vbios::*;

/// Length of the BIT 'i' entry (at least `BIT_I_MIN_LEN`).
const INFO_LEN: u16 = 0x10;
const _: () = assert!(INFO_LEN >= BIT_I_MIN_LEN);

/// Image size: 4 KiB, the least nouveau fetches before parsing (`shadow.c`).
pub const IMAGE_LEN: usize = 4096;

fn put16(img: &mut [u8], at: usize, v: u16) {
    img[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Builds the image.
pub fn image() -> Vec<u8> {
    let mut img = vec![0u8; IMAGE_LEN];
    img[0..2].copy_from_slice(&ROM_SIGNATURE);
    img[2] = (IMAGE_LEN / 512) as u8;
    // PCI data structure at 0x40.
    let pcir = 0x40;
    put16(&mut img, PCIR_POINTER, pcir as u16);
    put16(&mut img, DCB_POINTER, 0);
    img[pcir..pcir + 4].copy_from_slice(&PCIR_SIGNATURE);
    put16(&mut img, pcir + 4, pci::VENDOR_ID);
    put16(&mut img, pcir + 6, pci::DEVICE_ID);
    put16(&mut img, pcir + 0x0a, 0x18); // structure length
    img[pcir + 0x0c] = 0; // structure revision
    let class = pci::CLASS_CODE.to_le_bytes();
    img[pcir + 0x0d..pcir + 0x10].copy_from_slice(&class[..3]);
    put16(&mut img, pcir + PCIR_IMAGE_LEN, (IMAGE_LEN / 512) as u16);
    img[pcir + PCIR_CODE_TYPE] = CODE_TYPE_X86;
    img[pcir + PCIR_INDICATOR] = 0x80; // last image
                                       // BIT table at 0x80: header, then two entries, then their data.
    let bit = 0x80;
    let entries = 2usize;
    img[bit..bit + 5].copy_from_slice(&BIT_SIGNATURE);
    img[bit + 6] = 0x00; // BCD version 1.00 (not checked by nouveau)
    img[bit + 7] = 0x01;
    img[bit + 8] = BIT_HEADER_LEN as u8;
    img[bit + 9] = BIT_ENTRY_LEN as u8;
    img[bit + 10] = entries as u8;
    let data = bit + BIT_HEADER_LEN + entries * BIT_ENTRY_LEN; // 0x98
    let info = data.next_multiple_of(16); // 'i' data at 0xa0
    let init = info + 0x20; // 'I' data at 0xc0
    let scripts = init + 0x20; // an empty script list (one u16 0) at 0xe0
    let mut e = bit + BIT_HEADER_LEN;
    for (id, version, len, at) in [(b'i', 0u8, 0x10u16, info), (b'I', 0u8, BIT_INIT_LEN, init)] {
        img[e] = id;
        img[e + 1] = version;
        put16(&mut img, e + 2, len);
        put16(&mut img, e + 4, at as u16);
        e += BIT_ENTRY_LEN;
    }
    // 'i': version bytes micro, minor, chip, major, then patch; feature byte +5 = 0;
    // DAC-compare pointer at +13 = 0.
    img[info..info + 5].copy_from_slice(&[0x01, 0x00, 0xc0, 0x70, 0x00]);
    // 'I': +0 script table pointer; every other table pointer 0.
    put16(&mut img, init, scripts as u16);
    put16(&mut img, scripts, 0);
    // Byte sum 0: the last byte balances the rest.
    let sum = img[..IMAGE_LEN - 1]
        .iter()
        .fold(0u8, |s, b| s.wrapping_add(*b));
    img[IMAGE_LEN - 1] = 0u8.wrapping_sub(sum);
    img
}

/// The 32-bit word of the PROM window at `off` (past the image: zero).
pub fn prom_word(img: &[u8], off: u32) -> u32 {
    let at = off as usize & !3;
    let mut b = [0u8; 4];
    for (i, x) in b.iter_mut().enumerate() {
        *x = img.get(at + i).copied().unwrap_or(0);
    }
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(img: &[u8], at: usize) -> usize {
        u16::from_le_bytes([img[at], img[at + 1]]) as usize
    }

    /// Walks the image the way nouveau does (shadow.c, image.c, pcir.c, bit.c).
    #[test]
    fn image_passes_nouveau_checks() {
        let img = image();
        assert_eq!(&img[0..2], &[0x55, 0xaa]);
        assert_eq!(img.iter().fold(0u8, |s, b| s.wrapping_add(*b)), 0);
        let pcir = u16_at(&img, PCIR_POINTER);
        assert_eq!(&img[pcir..pcir + 4], b"PCIR");
        assert_eq!(u16_at(&img, pcir + 4), 0x10de);
        assert_eq!(u16_at(&img, pcir + 6), 0x06d8);
        assert_eq!(u16_at(&img, pcir + PCIR_IMAGE_LEN) * 512, img.len());
        assert_eq!(img[pcir + PCIR_CODE_TYPE], 0);
        assert_ne!(img[pcir + PCIR_INDICATOR] & 0x80, 0);
        assert_eq!(u16_at(&img, DCB_POINTER), 0);
        let bit = img
            .windows(5)
            .position(|w| w == BIT_SIGNATURE)
            .expect("BIT signature");
        let (size, count) = (img[bit + 9] as usize, img[bit + 10] as usize);
        let mut tokens = std::collections::BTreeMap::new();
        for i in 0..count {
            let e = bit + 12 + i * size;
            tokens.insert(img[e], (u16_at(&img, e + 2), u16_at(&img, e + 4)));
        }
        let (ilen, idata) = tokens[&b'i'];
        assert!(ilen >= 15);
        assert_eq!(img[idata + 3], 0x70); // major
        assert_eq!(u16_at(&img, idata + 13), 0); // no DAC-compare table
        let (ilen, idata) = tokens[&b'I'];
        assert!(ilen >= 14);
        let scripts = u16_at(&img, idata);
        assert!(scripts > 0 && scripts < img.len());
        assert_eq!(u16_at(&img, scripts), 0, "empty script list");
        // Every pointer stays inside the image.
        for &(len, at) in tokens.values() {
            assert!(at + len <= img.len());
        }
    }

    #[test]
    fn prom_words_are_little_endian_and_zero_past_the_image() {
        let img = image();
        assert_eq!(prom_word(&img, 0) & 0xffff, 0xaa55);
        assert_eq!(prom_word(&img, 2), prom_word(&img, 0));
        assert_eq!(prom_word(&img, IMAGE_LEN as u32 + 64), 0);
    }
}
