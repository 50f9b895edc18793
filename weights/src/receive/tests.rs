use super::*;
use crate::manifest::Bucket;

#[test]
fn a_strided_destination_receives_every_element_where_its_strides_say() {
    // A 2x3 f32 tensor stored transposed (column-major): strides [1, 2].
    let src: Vec<u8> = (0u8..24).collect();
    let mut dst = vec![0u8; 24];
    scatter(&mut dst, &src, &[2, 3], &[1, 2], 4);
    let el = |i: usize| &src[i * 4..i * 4 + 4];
    // Element (r, c) of the C-ordered source lands at r*1 + c*2.
    for r in 0..2 {
        for c in 0..3 {
            let at = (r + c * 2) * 4;
            assert_eq!(&dst[at..at + 4], el(r * 3 + c), "({r},{c})");
        }
    }
    // A padded row (stride 4 for 3 columns) leaves the padding alone.
    let mut dst = vec![0xaa; 2 * 4 * 4];
    scatter(&mut dst, &src, &[2, 3], &[4, 1], 4);
    assert_eq!(&dst[..12], &src[..12]);
    assert_eq!(&dst[12..16], &[0xaa; 4]);
    assert_eq!(&dst[16..28], &src[12..24]);
}

#[test]
fn contiguity_and_extent_follow_torchs_rules() {
    assert!(is_c_contiguous(&[2, 3], &[3, 1]));
    assert!(is_c_contiguous(&[1, 3], &[99, 1]));
    assert!(!is_c_contiguous(&[2, 3], &[1, 2]));
    assert_eq!(
        strided_extent(DType::F32, &[2, 3], &[4, 1]).unwrap(),
        (4 + 2 + 1) * 4
    );
    assert_eq!(strided_extent(DType::F32, &[0, 3], &[4, 1]).unwrap(), 0);
    let e = strided_extent(DType::F32, &[2, 3], &[0, 1]).unwrap_err();
    assert!(e.contains("overlap"), "{e}");
    let e = strided_extent(DType::F32, &[2, 3], &[1]).unwrap_err();
    assert!(e.contains("1 strides for 2 dimensions"), "{e}");
}

fn manifest() -> Manifest {
    Manifest {
        version: 3,
        buckets: Vec::<Bucket>::new(),
        tensors: vec![
            Entry {
                name: "a".into(),
                dtype: DType::F32,
                shape: vec![2, 2],
                bucket: 0,
                offset: 0,
                part: None,
            },
            Entry {
                name: "b".into(),
                dtype: DType::BF16,
                shape: vec![4],
                bucket: 0,
                offset: 64,
                part: None,
            },
        ],
    }
}

#[test]
fn every_mismatch_is_named_and_nothing_is_matched() {
    let m = manifest();
    let mut a = vec![0u8; 16];
    let mut b = vec![0u8; 4];
    let mut c = vec![0u8; 4];
    let targets = [
        Target {
            name: "a".into(),
            dtype: DType::F32,
            shape: vec![4],
            strides: None,
            bytes: &mut a,
        },
        Target {
            name: "b".into(),
            dtype: DType::BF16,
            shape: vec![4],
            strides: None,
            bytes: &mut b,
        },
        Target {
            name: "c".into(),
            dtype: DType::F32,
            shape: vec![1],
            strides: None,
            bytes: &mut c,
        },
    ];
    let e = match_targets(&m, &targets, false, None).unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("3 tensor(s) do not fit"), "{text}");
    assert!(
        text.contains("\"a\": shape [2, 2] published, [4] here"),
        "{text}"
    );
    assert!(
        text.contains("\"b\": the destination has 4 bytes; 8 are needed"),
        "{text}"
    );
    assert!(text.contains("\"c\": not in version 3"), "{text}");
}

#[test]
fn a_partial_receiver_takes_only_the_tensors_it_has() {
    let m = manifest();
    let mut b = vec![0u8; 8];
    let targets = [Target {
        name: "b".into(),
        dtype: DType::BF16,
        shape: vec![4],
        strides: None,
        bytes: &mut b,
    }];
    assert_eq!(
        match_targets(&m, &targets, true, None).unwrap(),
        vec![(0, 1)]
    );
    let e = match_targets(&m, &targets, false, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"a\": in version 3 but not in this receiver"),
        "{e}"
    );
}
