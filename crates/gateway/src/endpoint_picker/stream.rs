//! One `ExternalProcessor/Process` stream: one HTTP request, its messages
//! in the order the data plane sends them, each answered as the protocol
//! and the body mode ask.
//!
//! FULL_DUPLEX_STREAMED: the request headers are held unanswered while
//! the body arrives in chunks; at its end the picker answers the headers
//! with the decision, then sends the body back as streamed mutations; the
//! answer's body chunks go back the same way as they come. BUFFERED: the
//! headers are answered at once, the whole body comes in one message and
//! is answered with the decision (and the body replaced only when the
//! picker changed it).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use futures_util::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::answer;
use super::protocol::{DESTINATION, MODEL_REWRITE};
use super::request::{self, Body, Head, OwnAnswer, Picked};
use super::response::Answer;
use crate::generation::Generation;
use crate::state::State;

/// Answers queued for the data plane before the picker waits for it to
/// read them (a body sent back in chunks).
const OUTBOX: usize = 16;

pub struct Processor {
    state: Arc<State>,
}

impl Processor {
    pub fn new(state: Arc<State>) -> Self {
        Self { state }
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let peer = request
            .remote_addr()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let inbound = request.into_inner();
        let (tx, mut rx) = mpsc::channel(OUTBOX);
        let exchange = Exchange::new(Arc::clone(&self.state), peer, tx);
        tokio::spawn(exchange.run(inbound));
        let answers = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Ok(Response::new(Box::pin(answers)))
    }
}

/// How a body travels, one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// In chunks, each sent back as a streamed mutation.
    Duplex,
    /// Whole (or in chunks, each answered), after the headers' answer.
    Buffered,
}

impl Mode {
    fn of(configured: config::BodyMode) -> Self {
        match configured {
            config::BodyMode::FullDuplexStreamed => Self::Duplex,
            config::BodyMode::Buffered => Self::Buffered,
        }
    }

    /// The mode Envoy names in its protocol configuration.
    fn named(mode: i32) -> Self {
        match BodySendMode::try_from(mode) {
            Ok(BodySendMode::FullDuplexStreamed) => Self::Duplex,
            _ => Self::Buffered,
        }
    }
}

/// Where the request is.
// One per stream, in place for its life: boxing the larger variants would
// cost an allocation each and save nothing.
#[allow(clippy::large_enum_variant)]
enum Phase {
    /// Nothing yet.
    Start,
    /// The head is known; the body arrives.
    Receiving { head: Head, body: Body },
    /// The decision went out; the answer comes back through the data plane.
    Answered(Answer),
    /// The picker answered the client itself, or the request is over.
    Done,
}

struct Exchange {
    state: Arc<State>,
    generation: Arc<Generation>,
    peer: SocketAddr,
    out: mpsc::Sender<Result<ProcessingResponse, Status>>,
    request_mode: Mode,
    response_mode: Mode,
    /// The data plane only watches (`observability_mode`): nothing is
    /// answered.
    observing: bool,
    phase: Phase,
    /// Messages that arrived while the picker was deciding.
    early: VecDeque<ProcessingRequest>,
}

impl Exchange {
    fn new(
        state: Arc<State>,
        peer: SocketAddr,
        out: mpsc::Sender<Result<ProcessingResponse, Status>>,
    ) -> Self {
        // The request sees this generation of the config to its end.
        let generation = state.generation();
        let configured = generation
            .applied
            .spec
            .endpoint_picker
            .as_ref()
            .map(|e| e.body_mode)
            .unwrap_or_default();
        Self {
            state,
            generation,
            peer,
            out,
            request_mode: Mode::of(configured),
            response_mode: Mode::of(configured),
            observing: false,
            phase: Phase::Start,
            early: VecDeque::new(),
        }
    }

    /// Every message in order until the data plane closes the stream;
    /// dropping the exchange then ends the request (its load and record)
    /// however far it got.
    async fn run(mut self, mut inbound: Streaming<ProcessingRequest>) {
        loop {
            let message = match self.early.pop_front() {
                Some(m) => m,
                None => match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "the data plane's stream failed");
                        break;
                    }
                },
            };
            if !self.on_message(message, &mut inbound).await {
                break;
            }
        }
    }

    /// One message; `false` when the data plane is gone.
    async fn on_message(
        &mut self,
        message: ProcessingRequest,
        inbound: &mut Streaming<ProcessingRequest>,
    ) -> bool {
        if let Some(protocol) = message.protocol_config {
            self.follow(protocol);
        }
        self.observing = message.observability_mode;
        let metadata = message.metadata_context.as_ref();
        match message.request {
            Some(Message::RequestHeaders(headers)) => {
                self.on_request_headers(&headers, metadata, inbound).await
            }
            Some(Message::RequestBody(body)) => self.on_request_body(body, inbound).await,
            Some(Message::RequestTrailers(_)) => {
                if matches!(self.phase, Phase::Receiving { .. })
                    && !self.finish_request(inbound).await
                {
                    return false;
                }
                self.send(answer::request_trailers_continue()).await
            }
            Some(Message::ResponseHeaders(headers)) => {
                if let Phase::Answered(answer) = &mut self.phase {
                    answer.on_headers(&headers, metadata);
                }
                self.send(answer::response_headers_continue()).await
            }
            Some(Message::ResponseBody(body)) => self.on_response_body(body).await,
            Some(Message::ResponseTrailers(_)) => {
                if let Phase::Answered(answer) = &mut self.phase {
                    answer.on_trailers();
                }
                self.send(answer::response_trailers_continue()).await
            }
            None => true,
        }
    }

    /// The body modes Envoy says it uses win over the configured one.
    fn follow(&mut self, protocol: ProtocolConfiguration) {
        self.request_mode = Mode::named(protocol.request_body_mode);
        self.response_mode = Mode::named(protocol.response_body_mode);
    }

    async fn on_request_headers(
        &mut self,
        headers: &HttpHeaders,
        metadata: Option<&Metadata>,
        inbound: &mut Streaming<ProcessingRequest>,
    ) -> bool {
        if !matches!(self.phase, Phase::Start) {
            return true;
        }
        let head = request::head(
            &self.state,
            &self.generation,
            headers.headers.as_ref(),
            metadata,
            self.peer,
        )
        .await;
        let head = match head {
            Ok(head) => head,
            Err(own) => return self.answer_itself(own).await,
        };
        let body = Body::new(&self.generation);
        self.phase = Phase::Receiving { head, body };
        if headers.end_of_stream {
            // No body will come: decided on none (and refused as a body
            // that names no model).
            return self.finish_request(inbound).await;
        }
        if self.request_mode == Mode::Buffered {
            return self.send(answer::request_headers_continue()).await;
        }
        true
    }

    async fn on_request_body(
        &mut self,
        chunk: HttpBody,
        inbound: &mut Streaming<ProcessingRequest>,
    ) -> bool {
        let Phase::Receiving { body, .. } = &mut self.phase else {
            return true;
        };
        if let Err(e) = body.push(&self.state, &chunk.body).await {
            let Phase::Receiving { head, .. } = std::mem::replace(&mut self.phase, Phase::Done)
            else {
                unreachable!("matched above")
            };
            return self
                .answer_itself(crate::respond::refuse(*head.record, e))
                .await;
        }
        if chunk.end_of_stream {
            return self.finish_request(inbound).await;
        }
        if self.request_mode == Mode::Buffered {
            // A body in parts, each answered (BUFFERED_PARTIAL, STREAMED).
            return self.send(answer::request_body_continue()).await;
        }
        true
    }

    /// The whole request is in: decide, and answer with the decision.
    async fn finish_request(&mut self, inbound: &mut Streaming<ProcessingRequest>) -> bool {
        let Phase::Receiving { head, body } = std::mem::replace(&mut self.phase, Phase::Done)
        else {
            return true;
        };
        let fallbacks = self
            .generation
            .applied
            .spec
            .endpoint_picker
            .as_ref()
            .map_or(config::defaults::ENDPOINT_PICKER_FALLBACKS, |e| {
                e.fallbacks()
            });
        let (state, generation) = (Arc::clone(&self.state), Arc::clone(&self.generation));
        let deciding = request::decide(&state, &generation, head, body, fallbacks);
        tokio::pin!(deciding);
        // Admission may wait in line: a data plane that gives up meanwhile
        // takes the request out of it.
        let decided = loop {
            tokio::select! {
                decided = &mut deciding => break decided,
                next = inbound.message() => match next {
                    Ok(Some(m)) => self.early.push_back(m),
                    _ => return false,
                },
            }
        };
        match decided {
            Ok(picked) => self.answer(picked).await,
            Err(own) => self.answer_itself(own).await,
        }
    }

    /// The decision, as the request's body mode asks.
    async fn answer(&mut self, picked: Picked) -> bool {
        let mut headers = vec![(DESTINATION, picked.endpoints.clone())];
        if let Some(model) = &picked.rewritten {
            headers.push((MODEL_REWRITE, model.to_string()));
        }
        let answers = match self.request_mode {
            Mode::Duplex => {
                headers.push(("content-length", picked.body.len().to_string()));
                answer::picked_streamed(
                    answer::set_headers(&headers),
                    &picked.endpoints,
                    &picked.body,
                )
            }
            Mode::Buffered => {
                let changed = picked.changed.then_some(&picked.body);
                if changed.is_some() {
                    headers.push(("content-length", picked.body.len().to_string()));
                }
                vec![answer::picked_buffered(
                    answer::set_headers(&headers),
                    &picked.endpoints,
                    changed,
                )]
            }
        };
        tracing::debug!(endpoints = %picked.endpoints, "picked for the data plane");
        self.phase = Phase::Answered(Answer::new(picked, Arc::clone(&self.generation)));
        for a in answers {
            if !self.send(a).await {
                return false;
            }
        }
        true
    }

    async fn on_response_body(&mut self, chunk: HttpBody) -> bool {
        let kept = match &mut self.phase {
            Phase::Answered(answer) => answer.on_body(&chunk.body, chunk.end_of_stream),
            _ => None,
        };
        let end = chunk.end_of_stream;
        match (self.response_mode, kept) {
            // Nothing for the client in this chunk (the usage event, or
            // the start of an event): the next carries it on.
            (Mode::Duplex, Some(kept)) if kept.is_empty() && !end => true,
            (Mode::Duplex, kept) => {
                let body = kept.unwrap_or(chunk.body);
                self.send(answer::response_body_echo(body, end)).await
            }
            (Mode::Buffered, Some(kept)) if kept != chunk.body => {
                self.send(answer::response_body_replaced(kept)).await
            }
            (Mode::Buffered, _) => self.send(answer::response_body_continue()).await,
        }
    }

    /// The picker answers the client itself; the request is over.
    async fn answer_itself(&mut self, own: OwnAnswer) -> bool {
        self.phase = Phase::Done;
        let immediate = answer::immediate(own).await;
        self.send(immediate).await
    }

    async fn send(&self, answer: ProcessingResponse) -> bool {
        if self.observing {
            return true;
        }
        self.out.send(Ok(answer)).await.is_ok()
    }
}
