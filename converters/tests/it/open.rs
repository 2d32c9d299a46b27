use memsnap_converters::{open_bytes_with, Source};
use memsnap_format::{io::encode, Format, Snapshot};

#[test]
fn own_formats_open_through_the_converters() {
    let snapshot = Snapshot::default();
    for format in [Format::Pickle, Format::Msgpack, Format::Json] {
        let bytes = encode(&snapshot, format).unwrap();
        let (opened, source) = open_bytes_with(&bytes, &mut |_, _| true).unwrap();
        assert_eq!(opened.segments.len(), snapshot.segments.len());
        assert_eq!(
            opened.device_traces.is_some(),
            snapshot.device_traces.is_some()
        );
        assert!(matches!(source, Source::Snapshot(d) if d.format == format));
    }
}
