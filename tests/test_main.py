"""vmoe_sparse_ot.main: a lost process is recognised and named in one line."""
import json
import subprocess
import sys
import textwrap

from tests.train import helpers


LOST_PEER = textwrap.dedent('''
    import json, sys
    from vmoe_sparse_ot import main
    from vmoe_sparse_ot import errors
    gloo = RuntimeError('INTERNAL: Error dispatching computation: Gloo all-reduce failed: '
                        '[pair.cc:538] Read error [127.0.0.1]:52944: Connection reset by peer')
    try:  # A checkpoint write that failed on a collective with the dead process.
      try:
        raise ValueError('UNKNOWN: Gloo AllGather failed: Connection closed by peer')
      except ValueError as e:
        raise errors.CheckpointWriteError('Writing checkpoint step 20 failed') from e
    except errors.CheckpointWriteError as e:
      write = e
    print(json.dumps({
        'detected': [main.lost_peer(x) for x in (gloo, write, ValueError('lr must be > 0'))],
        'messages': [main.lost_peer_message(gloo, sys.argv[1], 0, 2),
                     main.lost_peer_message(gloo, sys.argv[2], 1, 3)]}))
''')


def test_a_lost_process_is_named_in_one_line_that_says_how_to_resume(tmp_path):
  # Killing one of two real processes costs over a minute on a loaded 2-core machine, so
  # that is measured by hand; here: what is recognised as a lost peer, and the line.
  saved = tmp_path / 'saved'
  for name in ('20', '40', '60.orbax-checkpoint-tmp-1', '40.corrupt'):
    (saved / 'checkpoints' / name).mkdir(parents=True)
  result = subprocess.run([sys.executable, '-c', LOST_PEER, str(saved), str(tmp_path / 'new')],
                          cwd=helpers.ROOT, env=helpers.env(), capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout)
  assert out['detected'] == [True, True, False]
  prefix = 'python -m vmoe_sparse_ot.main: error: process '
  assert out['messages'] == [
      prefix + '0 lost contact with process 1 (INTERNAL: Gloo all-reduce failed: [pair.cc:538] '
      'Read error [127.0.0.1]:52944: Connection reset by peer); stopping. Relaunching all 2 '
      f'processes with the same flags resumes from the last checkpoint (step 40 in {saved}/'
      'checkpoints).',
      prefix + '1 lost contact with another of the 3 processes (INTERNAL: Gloo all-reduce '
      'failed: [pair.cc:538] Read error [127.0.0.1]:52944: Connection reset by peer); stopping. '
      'Relaunching all 3 processes with the same flags resumes from the start (no checkpoint '
      'was written yet).']
