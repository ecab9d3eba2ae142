// A worker test guest in JavaScript (tests/worker.rs builds it with
// `moat worker build`): reads an input through the `inputs` binding and
// writes it back reversed through `outputs`.
import { names, read } from 'moat:worker/inputs@0.1.0';
import { write } from 'moat:worker/outputs@0.1.0';

export const run = {
  run() {
    const listed = names();
    const text = new TextDecoder().decode(read(listed[0]));
    write('reversed.txt', new TextEncoder().encode([...text].reverse().join('')));
    console.log(`hello from javascript, reversed ${listed[0]}`);
  },
};
