//! A run's events as a server-sent event stream (the API's and the
//! Inspector's live timeline).

use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};

use super::AppState;
use super::wake::Topic;

/// The SSE stream of a run's events after `after`. With `named`, each SSE
/// event carries the event type as its name (API clients filter on it);
/// without, all are plain messages (what a page's `onmessage` receives).
pub(crate) fn run_events_sse(
    state: Arc<AppState>,
    org: String,
    run: String,
    after: i64,
    named: bool,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    let stream = futures_util::stream::unfold(
        (
            state,
            org,
            run,
            after,
            std::collections::VecDeque::new(),
            false,
        ),
        move |(state, org, run, mut after, mut queue, mut ended)| async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    return Some((Ok(e), (state, org, run, after, queue, ended)));
                }
                if ended {
                    return None;
                }
                let (o, r) = (org.clone(), run.clone());
                let found = state
                    .wait_for(Duration::from_secs(15), Topic::Run(run.clone()), move |s| {
                        let page = s.events(&o, Some(&r), after, 500)?;
                        if !page.events.is_empty() {
                            return Ok(Some((page, false)));
                        }
                        let done = s.run(&o, &r)?.is_none_or(|run| run.state.is_final());
                        Ok(done.then_some((page, true)))
                    })
                    .await;
                match found {
                    Ok(Some((page, done))) => {
                        ended = done;
                        after = page.last_seq;
                        for stored in page.events {
                            let data = stored.to_json().to_string();
                            let sse = SseEvent::default().id(stored.seq.to_string()).data(data);
                            queue.push_back(if named {
                                sse.event(stored.event.event_type.as_str())
                            } else {
                                sse
                            });
                        }
                        if done && !named {
                            // A page's EventSource would reconnect forever.
                            queue.push_back(SseEvent::default().event("end").data("end"));
                        }
                    }
                    Ok(None) => {}
                    Err(_) => return None,
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}
