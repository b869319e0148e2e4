//! Busy polling before parking ([`BusyPoll`], `--busy-poll`).
//!
//! With simulated time ([`SimDriver::run_turn`]): the loop polls while
//! completions keep arriving, parks once a whole budget passed in quiet,
//! and never polls at idle. With real sockets on both back ends: the
//! shard thread's CPU time (from the kernel's scheduler statistics)
//! stands still while nothing arrives, and grows while it polls after
//! traffic.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferry_engine::sim::SimDriver;
use ferry_engine::uring::UringDriver;
use ferry_engine::{
    run_shard_polling, BusyPoll, Completion, Doorbell, Driver, EpollDriver, Handler, Slot, Wait,
};

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Echoes what each connection sends; connections take slots 0, 1, ...
#[derive(Default)]
struct Echo {
    accepted: Vec<TcpStream>,
    next_slot: Slot,
    /// Bytes to echo per slot, and whether a send is in flight there.
    out: HashMap<Slot, (Vec<u8>, bool)>,
    spare: Vec<Vec<u8>>,
    /// Work for the next turn without waiting (as a shard with queued sends).
    pending: bool,
    stop: Arc<AtomicBool>,
}

impl<D: Driver> Handler<D> for Echo {
    fn on_completion(&mut self, c: Completion<'_>, _now: Instant) {
        match c {
            Completion::Accepted { stream, .. } => self.accepted.push(stream),
            Completion::Received { slot, data } => {
                self.out.entry(slot).or_default().0.extend_from_slice(data)
            }
            Completion::Sent { slot, buf, .. } => {
                self.spare.push(buf);
                if let Some(o) = self.out.get_mut(&slot) {
                    o.1 = false;
                }
            }
            Completion::RecvClosed { .. } | Completion::Record { .. } | Completion::Woken => {}
        }
    }

    fn after_turn(&mut self, driver: &mut D, _now: Instant) {
        for stream in self.accepted.drain(..) {
            driver.attach(self.next_slot, stream).expect("attach");
            self.next_slot += 1;
        }
        for (&slot, (bytes, in_flight)) in &mut self.out {
            if !*in_flight && !bytes.is_empty() {
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.append(bytes);
                driver.send(slot, buf);
                *in_flight = true;
            }
        }
    }

    fn timeout(&mut self, _now: Instant) -> Option<Duration> {
        self.pending.then_some(Duration::ZERO)
    }

    fn has_mail(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn finished(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

const PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 40000);

#[test]
fn sim_polls_while_work_arrives_and_parks_after_a_quiet_budget() {
    let budget = us(1000);
    let mut d = SimDriver::new().unwrap();
    let mut h = Echo::default();
    let mut poll = BusyPoll::new(budget);
    let t0 = Instant::now();

    // Idle: every turn parks; none polls.
    for i in 0..100 {
        assert_eq!(
            d.run_turn(&mut h, &mut poll, t0 + us(i * 300)),
            Wait::Park(None)
        );
    }

    // A connection arrives while parked; from then on the loop polls.
    d.connect(0, PEER).unwrap();
    let mut t = t0 + us(50_000);
    assert_eq!(d.run_turn(&mut h, &mut poll, t), Wait::Park(None));
    // A ping every 0.6 budget for 20 budgets: polling throughout, well
    // past the first budget, every echo delivered.
    for _ in 0..33 {
        t += us(600);
        d.receive(0, b"ping");
        assert_eq!(d.run_turn(&mut h, &mut poll, t), Wait::Poll);
    }
    // The last echo's send completes in the next turn: an arrival too.
    t += us(100);
    assert_eq!(d.run_turn(&mut h, &mut poll, t), Wait::Poll);
    assert_eq!(d.take_output(0), b"ping".repeat(33));
    // Quiet: polls until a whole budget has passed, then parks.
    for k in 1..=9 {
        assert_eq!(
            d.run_turn(&mut h, &mut poll, t + us(k * 100)),
            Wait::Poll,
            "{k}00 us into the quiet"
        );
    }
    assert_eq!(d.run_turn(&mut h, &mut poll, t + budget), Wait::Park(None));
    // And stays parked while nothing comes.
    for i in 1..50 {
        assert_eq!(
            d.run_turn(&mut h, &mut poll, t + budget + us(i * 250)),
            Wait::Park(None)
        );
    }
    // The next arrival starts another budget.
    t += us(20_000);
    d.receive(0, b"pong");
    assert_eq!(d.run_turn(&mut h, &mut poll, t), Wait::Park(None));
    assert_eq!(d.run_turn(&mut h, &mut poll, t + us(999)), Wait::Poll);
}

#[test]
fn sim_without_a_budget_never_polls_and_pending_work_does_not_park() {
    let mut d = SimDriver::new().unwrap();
    let mut h = Echo::default();
    let mut poll = BusyPoll::new(Duration::ZERO);
    let t0 = Instant::now();
    d.connect(0, PEER).unwrap();
    assert_eq!(d.run_turn(&mut h, &mut poll, t0), Wait::Park(None));
    for i in 1..=20 {
        d.receive(0, b"ping");
        assert_eq!(d.run_turn(&mut h, &mut poll, t0 + us(i)), Wait::Park(None));
    }
    // The handler's own pending work is taken without waiting, with or
    // without a budget.
    h.pending = true;
    assert_eq!(d.run_turn(&mut h, &mut poll, t0 + us(100)), Wait::Pending);
    let mut poll = BusyPoll::new(us(1000));
    assert_eq!(d.run_turn(&mut h, &mut poll, t0 + us(200)), Wait::Pending);
}

/// Nanoseconds thread `tid` of this process has run on a CPU (the
/// scheduler's own account, not the 10 ms ticks of `stat`).
fn cpu_ns(tid: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .expect("schedstat (the kernel's CONFIG_SCHED_INFO)");
    s.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("schedstat's first field")
}

/// How much CPU the shard thread `tid` used during `window`.
fn cpu_during(tid: &str, window: Duration) -> Duration {
    let before = cpu_ns(tid);
    std::thread::sleep(window);
    Duration::from_nanos(cpu_ns(tid) - before)
}

/// Waits (bounded) until thread `tid` is asleep: parked, not polling.
fn wait_until_asleep(tid: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // The state follows the parenthesised thread name.
        let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
        if state == Some("S") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "thread {tid} never went to sleep: {stat}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Most CPU a parked shard thread may show over an idle window: nothing
/// runs it but the odd stray wake-up (a few microseconds, measured).
const IDLE_CPU: Duration = Duration::from_millis(1);

fn idle_costs_nothing_and_polling_follows_traffic<D: Driver + 'static>(
    make: fn() -> io::Result<D>,
) {
    let budget = Duration::from_millis(200);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let thread_stop = stop.clone();
    let shard = std::thread::spawn(move || {
        let mut driver = make().expect("driver");
        driver.add_listener(listener).expect("listener");
        let bell = Doorbell::new(driver.waker());
        let tid = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        let tid = tid.file_name().unwrap().to_string_lossy().into_owned();
        ready_tx.send((bell.clone(), tid)).unwrap();
        let mut echo = Echo {
            stop: thread_stop,
            ..Echo::default()
        };
        let result = run_shard_polling(&mut driver, &bell, &mut echo, BusyPoll::new(budget));
        let _ = done_tx.send(result.map_err(|e| e.to_string()));
    });
    let (bell, tid) = ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();

    let idle = cpu_during(&tid, Duration::from_millis(200));
    assert!(idle < IDLE_CPU, "{idle:?} of CPU before any traffic");

    let mut client = TcpStream::connect(addr).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    client.write_all(b"ping").unwrap();
    let mut echo = [0u8; 4];
    client.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"ping");
    // Polling for the budget after the echo's send completed costs CPU:
    // all of it on an idle machine, a few per cent of it on a crowded one
    // where the thread gets a small share of a core (a parked thread
    // shows none: well under IDLE_CPU).
    let polled = cpu_during(&tid, budget);
    assert!(
        polled > budget / 50,
        "only {polled:?} of CPU in the {budget:?} after traffic"
    );
    // Once it sleeps again (the budget passed in quiet), it stays parked.
    wait_until_asleep(&tid);
    let idle = cpu_during(&tid, Duration::from_millis(300));
    assert!(idle < IDLE_CPU, "{idle:?} of CPU after the budget");

    stop.store(true, Ordering::Relaxed);
    bell.ring();
    let result = done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(result, Ok(()));
    shard.join().unwrap();
}

#[test]
fn epoll_idle_costs_nothing_and_polling_follows_traffic() {
    idle_costs_nothing_and_polling_follows_traffic(EpollDriver::new);
}

#[test]
fn uring_idle_costs_nothing_and_polling_follows_traffic() {
    match ferry_engine::uring::probe() {
        Ok(()) => idle_costs_nothing_and_polling_follows_traffic(UringDriver::new),
        Err(why) => ferry_testkit::skip!("io_uring is not usable here: {why}"),
    }
}
