//! Prints the fidelity of a replay of each file given: `cargo run -p memsnap-simulate
//! --example fidelity -- FILE...`.

use memsnap_simulate::{simulate, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for path in std::env::args().skip(1) {
        let (snapshot, _) = memsnap_format::io::read_path(std::path::Path::new(&path))?;
        let sim = simulate(&snapshot, &Options::default())?;
        println!(
            "{path}: settings {:?} ({})",
            sim.alloc_conf, sim.settings_source
        );
        for d in &sim.devices {
            let f = &d.fidelity;
            println!(
                "  device {}: {}/{} decisions reproduced, {} extra, {}/{} placements, {} differing steps, start: {} segments {} blocks ({} estimated), anomalies {}, oom {:?}, recorded oom {:?}",
                d.device, f.reproduced, f.segment_decisions, f.extra, f.placed_at_recorded_address,
                f.allocations, f.difference_count, d.start_segments, d.start_allocated_blocks,
                d.start_estimated_blocks, d.anomaly_count, d.oom.as_ref().map(|o| (o.event, o.recorded)),
                d.recorded.oom_event
            );
            if let Some((e, a, b)) = f.first_misplaced {
                println!("    first misplaced: event {e}: recorded {a:#x}, replay {b:#x}");
            }
            for diff in f.differences.iter().take(4) {
                println!(
                    "    event {} {}: pytorch {:?} replay {:?}",
                    diff.event, diff.step, diff.pytorch, diff.replay
                );
            }
            for a in d.anomalies.iter().take(3) {
                println!("    anomaly: {a}");
            }
        }
    }
    Ok(())
}
