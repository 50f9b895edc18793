use std::io;

use super::*;

/// The control endpoint's dialect, with a small head limit.
const LENIENT: Rules = Rules {
    max_bytes: 1024,
    max_fields: usize::MAX,
    line_ends: LineEnds::CrLfOrLf,
    values: Values::NotNul,
    max_length_digits: 19,
};

/// The transport consumer's dialect.
const STRICT: Rules = Rules {
    max_bytes: 1024,
    max_fields: 64,
    line_ends: LineEnds::CrLf,
    values: Values::Visible,
    max_length_digits: 20,
};

fn read(head: &[u8]) -> Result<Vec<String>, HeadError> {
    let mut out = Vec::new();
    read_lines(&mut io::Cursor::new(head), &LENIENT, |l| {
        out.push(l.to_owned());
        Ok(())
    })?;
    Ok(out)
}

fn fields(head: &[u8]) -> Result<Vec<Field>, HeadError> {
    read(head)?
        .iter()
        .skip(1)
        .map(|l| parse_field(l, &LENIENT))
        .collect()
}

#[test]
fn a_plain_head_parses_with_crlf_or_lf() {
    let f = fields(b"GET / HTTP/1.1\r\nA: 1\r\nb:2 \r\n\r\n").unwrap();
    assert_eq!(f, vec![("A".into(), "1".into()), ("b".into(), "2".into())]);
    assert_eq!(fields(b"GET / HTTP/1.1\nA: 1\n\n").unwrap().len(), 1);
}

#[test]
fn bare_cr_is_refused() {
    let e = read(b"GET / HTTP/1.1\r\nA: 1\rB: 2\r\n\r\n").unwrap_err();
    assert_eq!(e, malformed("bare CR in the head"));
}

#[test]
fn obs_fold_is_refused() {
    let e = fields(b"GET / HTTP/1.1\r\nA: 1\r\n 2\r\n\r\n").unwrap_err();
    assert!(e.to_string().contains("obsolete line folding"), "{e}");
    let e = fields(b"GET / HTTP/1.1\r\nA: 1\r\n\t2\r\n\r\n").unwrap_err();
    assert!(e.to_string().contains("obsolete line folding"), "{e}");
}

#[test]
fn whitespace_before_the_colon_is_refused() {
    let e = fields(b"GET / HTTP/1.1\r\nContent-Length : 5\r\n\r\n").unwrap_err();
    assert!(e.to_string().contains("is not a token"), "{e}");
}

#[test]
fn the_head_is_bounded_and_must_end() {
    let long = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(2000));
    assert_eq!(read(long.as_bytes()), Err(HeadError::TooLarge(1024)));
    assert!(matches!(
        read(b"GET / HTTP/1.1\r\nA: 1\r\n"),
        Err(HeadError::Io(_))
    ));
}

fn length(fields: &[(&str, &str)]) -> Result<Option<u64>, HeadError> {
    let f: Vec<Field> = fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    body_length(&f, &LENIENT)
}

#[test]
fn content_length_must_be_single_and_plain() {
    assert_eq!(length(&[("Content-Length", "42")]), Ok(Some(42)));
    assert_eq!(length(&[("x", "1")]), Ok(None));
    for bad in [
        vec![("content-length", "5"), ("Content-Length", "6")],
        vec![("content-length", "5"), ("content-length", "5")],
        vec![("content-length", "5, 5")],
        vec![("content-length", "+5")],
        vec![("content-length", "-1")],
        vec![("content-length", "0x10")],
        vec![("content-length", "")],
        vec![("content-length", "99999999999999999999")],
    ] {
        assert!(length(&bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn transfer_encoding_is_refused_with_or_without_content_length() {
    let e = length(&[("transfer-encoding", "chunked"), ("content-length", "5")]).unwrap_err();
    assert!(e.to_string().contains("ambiguous framing"), "{e}");
    let e = length(&[("content-length", "5"), ("transfer-encoding", "chunked")]).unwrap_err();
    assert!(e.to_string().contains("ambiguous framing"), "{e}");
    let e = length(&[("Transfer-Encoding", "chunked")]).unwrap_err();
    assert!(e.to_string().contains("not supported"), "{e}");
}

#[test]
fn framing_reports_what_it_found() {
    let f = |pairs: &[(&'static str, &'static str)], digits| {
        framing(
            pairs.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())),
            digits,
        )
    };
    assert_eq!(
        f(
            &[
                ("content-length", "3"),
                ("content-length", "4"),
                ("content-length", "5")
            ],
            20
        ),
        Err(FramingError::RepeatedLength {
            count: 3,
            values: [b"3".to_vec(), b"4".to_vec()]
        })
    );
    assert_eq!(
        f(&[("Transfer-Encoding", "gzip, chunked")], 20),
        Err(FramingError::TransferEncoding {
            value: b"gzip, chunked".to_vec(),
            lengths: 0
        })
    );
    // The digit limit is the dialect's; a u64 is the limit of every one.
    assert_eq!(
        f(&[("content-length", "10000000000000000000")], 20),
        Ok(Some(10_000_000_000_000_000_000))
    );
    assert!(f(&[("content-length", "10000000000000000000")], 19).is_err());
    assert_eq!(
        f(&[("content-length", "18446744073709551615")], 20),
        Ok(Some(u64::MAX))
    );
    assert!(f(&[("content-length", "18446744073709551616")], 20).is_err());
}

#[test]
fn framing_field_by_field_refuses_the_first_faulty_field() {
    let run = |pairs: &[(&str, &str)]| {
        let mut f = Framing::new(20);
        for (k, v) in pairs {
            f.field(k.as_bytes(), v.as_bytes())?;
        }
        Ok::<_, FramingError>(f.length())
    };
    assert_eq!(run(&[("x", "1")]), Ok(None));
    assert_eq!(run(&[("Content-Length", "7"), ("x", "1")]), Ok(Some(7)));
    assert_eq!(
        run(&[("content-length", "x"), ("transfer-encoding", "chunked")]),
        Err(FramingError::BadLength(b"x".to_vec()))
    );
    assert_eq!(
        run(&[("content-length", "3"), ("transfer-encoding", "chunked")]),
        Err(FramingError::TransferEncoding {
            value: b"chunked".to_vec(),
            lengths: 1
        })
    );
    assert_eq!(
        run(&[("content-length", "3"), ("content-length", "3")]),
        Err(FramingError::RepeatedLength {
            count: 2,
            values: [b"3".to_vec(), b"3".to_vec()]
        })
    );
    assert_eq!(
        run(&[("content-length", "3"), ("content-length", "+3")]),
        Err(FramingError::BadLength(b"+3".to_vec()))
    );
    // The whole-head check ranks the same faults instead.
    let whole = |pairs: &[(&'static str, &'static str)]| {
        framing(pairs.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())), 20)
    };
    assert!(matches!(
        whole(&[("content-length", "x"), ("transfer-encoding", "chunked")]),
        Err(FramingError::TransferEncoding { lengths: 1, .. })
    ));
}

#[test]
fn buffered_heads_end_at_the_first_blank_line_within_the_bound() {
    let head = b"HTTP/1.1 200 OK\r\na: 1\r\n\r\nbody";
    assert_eq!(head_len(head, &STRICT), Ok(Some(head.len() - 4)));
    for n in 0..head.len() - 4 {
        assert_eq!(head_len(&head[..n], &STRICT), Ok(None), "{n}");
    }
    let got: Vec<_> = lines(&head[..head.len() - 4], LineEnds::CrLf).collect();
    assert_eq!(got, vec![Ok(&b"HTTP/1.1 200 OK"[..]), Ok(&b"a: 1"[..])]);
    // A lone LF: a line end for the lenient dialect only.
    assert_eq!(
        head_len(b"GET / HTTP/1.1\na: 1\n\nrest", &LENIENT),
        Ok(Some(21))
    );
    assert_eq!(head_len(b"GET / HTTP/1.1\r\n\r\n", &LENIENT), Ok(Some(18)));
    let got: Vec<_> = lines(b"HTTP/1.1 200 OK\nx: y\r\n\r\n", LineEnds::CrLf).collect();
    assert_eq!(got[0], Err(LineError::NoCrLf));
    let got: Vec<_> = lines(b"GET / HTTP/1.1\r\nx: a\rb\n\n", LineEnds::CrLfOrLf).collect();
    assert_eq!(got[1], Err(LineError::BareCr));
    // Endless heads are refused once they reach the bound.
    let long = vec![b'a'; 1023];
    assert_eq!(head_len(&long, &STRICT), Ok(None));
    assert_eq!(
        head_len(&[b'a'; 1024], &STRICT),
        Err(HeadError::TooLarge(1024))
    );
}

#[test]
fn values_are_checked_by_the_dialect() {
    assert_eq!(
        field(b"x: a\x01b", Values::NotNul),
        Ok((&b"x"[..], &b"a\x01b"[..]))
    );
    assert_eq!(
        field(b"x: a\x01b", Values::Visible),
        Err(FieldError::BadValue(b"x"))
    );
    assert_eq!(
        field(b"x: a\x00b", Values::NotNul),
        Err(FieldError::BadValue(b"x"))
    );
    assert_eq!(
        field(b"x:\t v \t", Values::Visible),
        Ok((&b"x"[..], &b"v"[..]))
    );
    assert_eq!(field(b"x:   ", Values::Visible), Ok((&b"x"[..], &b""[..])));
    assert_eq!(
        field(b"no colon", Values::Visible),
        Err(FieldError::NoColon)
    );
    assert_eq!(
        field(b": x", Values::Visible),
        Err(FieldError::BadName(b""))
    );
    assert_eq!(field(b" x: y", Values::Visible), Err(FieldError::ObsFold));
}

#[test]
fn quote_escapes_and_cuts() {
    assert_eq!(quote(b"a b\x00"), "`a b\\x00`");
    assert_eq!(quote(&[b'x'; 70]), format!("`{}...`", "x".repeat(64)));
}

proptest::proptest! {
    #[test]
    fn a_head_cut_from_a_buffer_reads_like_a_streamed_one(
        lines_in in proptest::collection::vec("[ -~\t]{0,30}", 0..6),
    ) {
        let mut bytes = b"GET / HTTP/1.1\r\n".to_vec();
        for l in &lines_in {
            if l.is_empty() { continue; }
            bytes.extend_from_slice(l.as_bytes());
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"\r\n");
        let n = head_len(&bytes, &LENIENT).unwrap().unwrap();
        proptest::prop_assert_eq!(n, bytes.len());
        let cut: Vec<String> = lines(&bytes[..n], LineEnds::CrLfOrLf)
            .map(|l| String::from_utf8(l.unwrap().to_vec()).unwrap())
            .collect();
        proptest::prop_assert_eq!(cut, read(&bytes).unwrap());
    }
}

proptest::proptest! {
    #[test]
    fn whole_head_and_field_by_field_framing_agree(
        fields in proptest::collection::vec(
            (
                proptest::sample::select(vec!["content-length", "Content-Length", "transfer-encoding", "x"]),
                proptest::sample::select(vec!["0", "7", "007", "+7", "", "chunked", "18446744073709551616"]),
            ),
            0..5,
        ),
    ) {
        let whole = framing(fields.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())), 20);
        let mut each = Framing::new(20);
        let stepped = fields
            .iter()
            .try_for_each(|(k, v)| each.field(k.as_bytes(), v.as_bytes()))
            .map(|()| each.length());
        // The same heads are refused; what is accepted has the same length.
        proptest::prop_assert_eq!(whole.is_ok(), stepped.is_ok(), "{:?}", fields);
        if let (Ok(a), Ok(b)) = (&whole, &stepped) {
            proptest::prop_assert_eq!(a, b);
        }
    }
}
