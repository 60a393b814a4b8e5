//! DCP checkpoints written by tenplan read back by tenplan's reader: every
//! tensor (0-d ones included), every entry that is not a tensor, and the
//! state dict's nesting, byte for byte. (That PyTorch's own `dcp.load`
//! reads them is tested with real torch in `tests/dcp.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use tenplan_executor::generate::{fill_region, tensor_key};
use tenplan_formats::dcp::{self, Dcp, DcpExtras, PathPart};
use tenplan_formats::Source;
use tenplan_models::{MeshConfig, TensorPlacement};
use tenplan_ptc::{read_box, DType, Region, TensorSpec};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tenplan-dcp-write-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_written_checkpoint_reads_back_whole() {
    let tensors: Arc<[TensorSpec]> = vec![
        TensorSpec::new("model.w", DType::F32, [5, 4]),
        TensorSpec::new("model.b", DType::BF16, [3]),
        TensorSpec::new("optim.state.model.w.step", DType::F32, [1]),
        TensorSpec::new("optim.state.model.w.exp_avg", DType::F32, [5, 4]),
    ]
    .into();
    let scalars: BTreeSet<String> = ["optim.state.model.w.step".to_string()].into();
    let mesh: MeshConfig = "dp_replicate=2,dp_shard=2".parse().unwrap();
    let layout = mesh
        .layout(tensors.clone(), &|_, t| {
            Ok(TensorPlacement {
                tp_dim: None,
                fsdp: !scalars.contains(&t.name),
                fsdp_dim: None,
                experts: false,
                stack: None,
            })
        })
        .unwrap();
    let others: BTreeMap<String, Vec<u8>> = [("optim.param_groups.0.lr".to_string(), b"pickled 0.1".to_vec())].into();
    let planner_data: BTreeMap<String, Vec<PathPart>> = [(
        "optim.param_groups.0.lr".to_string(),
        vec![
            PathPart::Key("optim".into()),
            PathPart::Key("param_groups".into()),
            PathPart::Index(0),
            PathPart::Key("lr".into()),
        ],
    )]
    .into();
    let extras = DcpExtras {
        scalars: scalars.clone(),
        others,
        planner_data,
        side_files: Default::default(),
        saved_as: Default::default(),
        mirrors: Default::default(),
        main_replica_only: false,
        literals: Default::default(),
    };
    let keys: Vec<u64> = tensors.iter().map(|t| tensor_key(3, t)).collect();
    let out = scratch("whole");
    let w = dcp::write(
        &out,
        &layout,
        &extras,
        |b, slab, bytes| {
            fill_region(keys[b.tensor as usize], &tensors[b.tensor as usize], slab, bytes);
            Ok(())
        },
        &|_| {},
    )
    .unwrap();
    // Each box stored once (not once per replica): FSDP's two row chunks
    // of w, b and exp_avg, and the one step.
    assert_eq!((w.tensors, w.chunks, w.others), (4, 2 + 2 + 1 + 2, 1));
    assert!(!out.join(".tenplan-incomplete").exists());
    let d = Arc::new(Dcp::open(&out).unwrap());
    let state = d.state().unwrap();
    let back = state.extras();
    assert_eq!((&back.scalars, &back.others), (&extras.scalars, &extras.others));
    // Every key has its path; those not given are their own one-step path.
    for t in tensors.iter() {
        let want = extras
            .planner_data
            .get(&t.name)
            .cloned()
            .unwrap_or_else(|| vec![PathPart::Key(t.name.clone())]);
        assert_eq!(back.planner_data[&t.name], want);
    }
    assert_eq!(
        back.planner_data["optim.param_groups.0.lr"],
        extras.planner_data["optim.param_groups.0.lr"]
    );
    let read = state.layout().tensors();
    let mut names: Vec<&str> = read.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "model.b",
            "model.w",
            "optim.state.model.w.exp_avg",
            "optim.state.model.w.step"
        ]
    );
    let boxes = state.all_boxes();
    for (t, spec) in read.iter().enumerate() {
        let i = tensors.iter().position(|x| x.name == spec.name).unwrap();
        assert_eq!((spec.dtype, &spec.shape), (tensors[i].dtype, &tensors[i].shape));
        let whole = Region::full(&spec.shape);
        let n = (whole.volume() * spec.dtype.size()) as usize;
        let (mut got, mut want) = (vec![0u8; n], vec![0u8; n]);
        read_box(&boxes[t], &whole, &mut got, spec.dtype.size() as usize);
        fill_region(keys[i], &tensors[i], &whole, &mut want);
        assert_eq!(got, want, "{}", spec.name);
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_failed_write_leaves_nothing() {
    let tensors: Arc<[TensorSpec]> = vec![TensorSpec::new("w", DType::F32, [4, 4])].into();
    let mesh: MeshConfig = "dp_shard=2".parse().unwrap();
    let layout = mesh
        .layout(tensors, &|_, _| {
            Ok(TensorPlacement {
                tp_dim: None,
                fsdp: true,
                fsdp_dim: None,
                experts: false,
                stack: None,
            })
        })
        .unwrap();
    let out = scratch("fails");
    let r = dcp::write(
        &out,
        &layout,
        &DcpExtras::default(),
        |_, _, _| Err(tenplan_formats::Error::Fill("no data".into())),
        &|_| {},
    );
    assert!(r.is_err());
    assert!(!out.exists());
}
