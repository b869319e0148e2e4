//! Entry points for this crate's fuzz targets (`fuzz/fuzz_targets`), whose
//! committed corpora `tests/fuzz_corpus.rs` replays in the ordinary suite.

use crate::stat::scrape::Request;

/// `scrape_request`: the `/metrics` listener's reading of a request head
/// from a scraper, fed in pieces as reads would bring it. The first byte
/// picks the piece size (1–16 bytes) and the head cap (16 bytes to 2 KiB);
/// the rest is the head. Checks that a head at its cap is never left
/// waiting for more, and that a path comes without its query.
pub fn scrape_request(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let piece = usize::from(first & 15) + 1;
    let max = 16usize << ((first >> 4) & 7);
    let mut head = Vec::new();
    for chunk in rest.chunks(piece) {
        // The listener reads no more than the cap.
        let room = max - head.len();
        head.extend_from_slice(&chunk[..chunk.len().min(room)]);
        match Request::parse(&head, max) {
            Request::Partial => assert!(head.len() < max, "a full head left waiting"),
            Request::Get(path) => {
                assert!(!path.contains('?') && !path.contains('\n'), "{path:?}");
                return;
            }
            Request::TooLarge => {
                assert!(head.len() >= max);
                return;
            }
            Request::OtherMethod | Request::Bad => return,
        }
    }
}
